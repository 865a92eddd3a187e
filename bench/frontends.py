"""Front-end coverage, measured (issue 27): torchvision classifiers and
``transformers`` models built from configs (no weights are downloaded),
through both ONNX exporters (``torch.onnx.export(dynamo=True)``, today's
default, and ``dynamo=False``, the TorchScript one) and through
:func:`legionpy.frontends.from_torch` (torch.fx; for the ``transformers``
models, which fx cannot trace, ``from_torch(..., via="onnx")``).

Per model and path it prints: whether the model imported (or the operators
missing), the max relative error of ``predict`` against torch in eval mode
(``max |y - y_torch| / max |y_torch|``), and whether one ``fit`` step
(SGD, MSE to a random target, dropout off, batch norm on batch statistics
as in torch's train mode) moves every parameter as torch's gradients do
(max relative error of the gradients, each legionpy parameter matched to
the torch parameter holding the same initial values: transposed or not,
reshaped, a block of its rows (attention's q, k, v of one in_proj; the
positions a sequence uses), its row 0 broadcast (a token type); tied
weights and blocks summed over their uses; each parameter's error relative to its
largest gradient entry, floored at 1e-3 of the model's largest: gradients
that vanish in exact arithmetic, such as a batch norm's beta feeding
another batch norm, are rounding noise in both). The reference is torch's
gradient in float64; the "torch f32" column is torch's own float32 error
against it (how well conditioned the gradient is at this size: batch norm
over 2 samples of 2x2 maps loses digits in any float32 implementation).
The implied gradient is ``(before - after) / lr`` with ``lr`` 1e4: a small
step keeps few digits of a small gradient on a weight near 1.

    python bench/frontends.py                    # everything (CPU heavy: minutes)
    python bench/frontends.py resnet18 gpt2 --paths dynamo --batch 8

Needs torch, torchvision, transformers, onnx, onnxruntime, onnxscript.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
import traceback
import warnings

import numpy as np

B = 8
#: modules fx could not trace, imported by from_torch(via="onnx") instead
VIA_ONNX: set = set()


def vision(name: str, size: int = 64):
    def build():
        import torchvision.models as tvm

        kw = {"num_classes": 10}
        if name == "vit_b_16":
            kw["image_size"] = 32
            return tvm.vit_b_16(weights=None, **kw), (3, 32, 32)
        return getattr(tvm, name)(weights=None, **kw), (3, size, size)
    return build


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=128, n_positions=32,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    return _Logits(GPT2LMHeadModel(cfg)), ("ids", 16, 128)


def bert():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=64,
                     intermediate_size=128, vocab_size=128, max_position_embeddings=32,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return _Hidden(BertModel(cfg, add_pooling_layer=False)), ("ids", 16, 128)


def _wrap(kind):
    import torch

    class W(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            out = self.m(input_ids=ids, use_cache=False) if kind == "logits" else \
                self.m(input_ids=ids)
            return out.logits if kind == "logits" else out.last_hidden_state
    return W


def _Logits(m):
    return _wrap("logits")(m)


def _Hidden(m):
    return _wrap("hidden")(m)


MODELS = {
    "resnet18": vision("resnet18"), "resnet50": vision("resnet50"),
    "mobilenet_v2": vision("mobilenet_v2"), "mobilenet_v3_small": vision("mobilenet_v3_small"),
    "efficientnet_b0": vision("efficientnet_b0"), "regnet_y_400mf": vision("regnet_y_400mf"),
    "convnext_tiny": vision("convnext_tiny"), "vit_b_16": vision("vit_b_16"),
    "densenet121": vision("densenet121"), "squeezenet1_1": vision("squeezenet1_1"),
    "shufflenet_v2_x0_5": vision("shufflenet_v2_x0_5"),
    "gpt2": gpt2, "bert": bert,
}
PATHS = ("dynamo", "legacy", "fx")


def example(spec, n: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    if spec[0] == "ids":
        return torch.randint(0, spec[2], (n, spec[1]), generator=g)
    return torch.randn((n, *spec), generator=g)


def export(module, x, path: str, how: str, keep_bn: bool = False) -> None:
    """``keep_bn``: no optimisation passes (which fold batch norm into the
    convolutions: a model whose weights are no longer torch's to train)."""
    import torch

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if how == "dynamo":
            torch.onnx.export(module, (x,), path, dynamo=True, optimize=not keep_bn)
        else:
            torch.onnx.export(module, (x,), path, dynamo=False, opset_version=17,
                              do_constant_folding=not keep_bn)


def _no_dropout(module) -> None:
    import torch

    for m in module.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if hasattr(m, "p") and type(m).__name__ == "StochasticDepth":
            m.p = 0.0
        if isinstance(m, torch.nn.Embedding):
            # an exported graph's Gather trains every row; torch leaves the
            # padding row's gradient zero (BERT's id 0 shows at batch >= 6)
            m.padding_idx = None


def import_model(module, x, how: str, tmp: str, keep_bn: bool = False):
    import legionpy as lp

    if how == "fx":
        try:
            return lp.frontends.from_torch(module, x, batch_size=B)
        except lp.errors.ModelError as e:  # transformers' models: fx cannot trace them
            if "via='onnx'" not in str(e):
                raise
            VIA_ONNX.add(type(module).__name__)
            return lp.frontends.from_torch(module, x, batch_size=B, via="onnx")
    path = os.path.join(tmp, f"m_{how}.onnx")
    export(module, x, path, how, keep_bn)
    return lp.frontends.from_onnx(path, batch_size=B)


def _lead(a: np.ndarray) -> np.ndarray:
    """``a`` without leading size-1 dims (a (1, 1, D) class token is (D,))."""
    while a.ndim > 1 and a.shape[0] == 1:
        a = a[0]
    return a


def _match(lp_params: dict, torch_params: dict) -> dict:
    """legionpy name -> (torch name, form) by equal initial values. Forms:
    ``("same",)`` (maybe reshaped: a (1, 1, D) class token is legionpy's
    (1, D)), ``("T",)`` (transposed), ``("rows", lo, transposed)`` (a block
    of rows: MultiheadAttention's in_proj split into q, k, v; the leading
    rows of a position table the sequence uses), ``("row0",)`` (row 0
    broadcast over the sequence: BERT's token type)."""
    out = {}
    for name, v in lp_params.items():
        lv = _lead(v)
        for tn, t in torch_params.items():
            if _lead(t).shape == lv.shape and np.array_equal(_lead(t), lv):
                out[name] = (tn, ("same",))
                break
            if t.ndim == 2 and t.T.shape == v.shape and np.array_equal(t.T, v):
                out[name] = (tn, ("T",))
                break
        if name in out:
            continue
        for tn, t in torch_params.items():
            t = _lead(t)
            for tr, w in ((False, lv), (True, lv.T if lv.ndim == 2 else None)):
                if w is None or w.ndim != t.ndim or w.shape[1:] != t.shape[1:] or \
                        w.shape[0] >= t.shape[0]:
                    continue
                n = w.shape[0]
                lo = next((k for k in range(0, t.shape[0] - n + 1, n)
                           if np.array_equal(t[k:k + n], w)), None)
                if lo is not None:
                    out[name] = (tn, ("rows", lo, tr))
                    break
            if name in out:
                break
            if t.ndim == 2 and lv.ndim == 2 and lv.shape[1:] == t.shape[1:] and \
                    lv.shape[0] > 1 and np.array_equal(lv, np.broadcast_to(t[0], lv.shape)):
                out[name] = (tn, ("row0",))
                break
    return out


def _as_torch(g: np.ndarray, form: tuple, shape: tuple) -> np.ndarray:
    """legionpy's gradient ``g`` as a contribution to the torch parameter's."""
    if form[0] == "same":
        return g.reshape(shape)
    if form[0] == "T":
        return g.T
    full = np.zeros(shape)
    view = full.reshape(_lead(full).shape)
    if form[0] == "row0":
        view[0] = _lead(g).sum(0)
    else:
        w = _lead(g).T if form[2] else _lead(g)
        view[form[1]:form[1] + w.shape[0]] = w
    return full


def _torch_grads(module, x, target) -> dict:
    import torch

    module.zero_grad()
    loss = torch.nn.functional.mse_loss(module(x), torch.tensor(target).to(
        x.dtype if x.is_floating_point() else torch.float32))
    loss.backward()
    return {n: (p.grad.double().numpy().copy() if p.grad is not None else
                np.zeros(tuple(p.shape))) for n, p in module.named_parameters()}


def _rel_err(got: dict, want: dict, name: str = "") -> float:
    """max over parameters of max |got - want| / max |want| (a floor of
    1e-3 of the largest gradient: gradients that are zero in exact
    arithmetic, such as the beta of a batch norm that feeds a conv + batch
    norm, are noise on every side)."""
    floor = 1e-3 * max(float(np.abs(want[tn]).max()) for tn in got)
    err = 0.0
    for tn, g in got.items():
        scale = max(float(np.abs(want[tn]).max()), floor, 1e-30)
        e = float(np.abs(g - want[tn]).max()) / scale
        if os.environ.get("LEGIONPY_DEBUG") and e > 1e-4:
            print(f"    {name} gradient of {tn} {want[tn].shape}: rel err {e:.1e}")
        err = max(err, e)
    return err


def grad_check(module, model, x, lr: float = 1e4) -> tuple[float, float, int, int]:
    """One SGD step on MSE to a random target; the gradient it implies,
    ``(before - after) / lr``, against torch's computed in float64.

    The step is large (``lr`` 1e4) on purpose: with a small one the
    float32 difference ``before - after`` of a weight near 1 with a
    gradient near 1e-6 keeps one or two digits, which is what the
    0.08-0.18 "errors" measured before were. Returns (legionpy's max
    relative error, torch float32's own error against the same float64
    reference: how well the gradient is conditioned at this size, matched
    parameters, torch parameters)."""
    import copy

    import torch

    import legionpy as lp
    from legionpy.optimizer import Machine

    if any(op.kind == "batch_norm" for op in model.graph.ops):
        module.train()  # batch statistics, as legionpy's fit
    _no_dropout(module)
    y0 = module(x)
    rng = np.random.default_rng(1)
    target = rng.standard_normal(tuple(y0.shape)).astype(np.float32)
    model.compile(optimizer=lp.nn.SGD(lr=lr), loss="mse", machine=Machine.local(1))
    before = model.parameters()
    tparams = {n: p.detach().numpy().copy() for n, p in module.named_parameters()}
    pairs = _match(before, tparams)
    state = copy.deepcopy(module.state_dict())  # running stats: the same start for both
    t32 = _torch_grads(module, x, target)
    m64 = copy.deepcopy(module)
    m64.load_state_dict(state)
    m64.double()
    t64 = _torch_grads(m64, x.double() if x.is_floating_point() else x, target)
    xs = x.numpy().astype(np.int32 if x.dtype == torch.int64 else np.float32)
    model.fit(xs, target, epochs=1, batch_size=B, verbose=0, shuffle=False)
    after = model.parameters()
    grads: dict = {}  # torch name -> summed legionpy gradient (tied weights: every use)
    for name, (tn, form) in pairs.items():
        g = (before[name].astype(np.float64) - after[name]) / lr
        grads[tn] = grads.get(tn, 0) + _as_torch(g, form, tparams[tn].shape)
    err = _rel_err(grads, t64, "legionpy")
    torch_err = _rel_err({tn: t32[tn] for tn in grads}, t64, "torch f32")
    return err, torch_err, len(grads), len(tparams)


def run_one(name: str, how: str, tmp: str) -> dict:
    import torch

    import legionpy as lp
    from legionpy.frontends import UnsupportedOperatorError
    from legionpy.optimizer import Machine

    torch.manual_seed(0)
    module, spec = MODELS[name]()
    module.eval()
    _no_dropout(module)
    with torch.no_grad():  # distinct values in every parameter: matched by value below
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    x = example(spec, B)
    row = {"model": name, "path": how}
    t0 = time.perf_counter()
    try:
        model = import_model(module, x, how, tmp)
    except UnsupportedOperatorError as e:
        lines = [ln for ln in str(e).splitlines()[1:] if ": " in ln and
                 not ln.startswith("supported")]
        row["status"] = "missing: " + ", ".join(ln.split(":")[0].strip() for ln in lines)
        row["detail"] = "; ".join(ln.strip() for ln in lines)
        return row
    except Exception as e:  # noqa: BLE001 - reported in the table
        row["status"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:150]}"
        if os.environ.get("LEGIONPY_DEBUG"):
            traceback.print_exc()
        return row
    row["import_s"] = time.perf_counter() - t0
    row["status"] = "imported" + (" (from_torch via='onnx')" if how == "fx" and
                                  type(module).__name__ in VIA_ONNX else "")
    try:
        with torch.no_grad():
            want = module(x).numpy()
        model.compile(optimizer=lp.nn.SGD(lr=0.1), loss="mse", machine=Machine.local(1))
        xs = x.numpy().astype(np.int32 if x.dtype == torch.int64 else np.float32)
        got = model.predict(xs)
        row["predict_rel_err"] = float(np.abs(got.reshape(want.shape) - want).max()
                                       / max(np.abs(want).max(), 1e-12))
        fresh = import_model(module, x, how, tmp, keep_bn=True)
        err, terr, matched, total = grad_check(module, fresh, x)
        row["grad_rel_err"], row["params_matched"] = err, f"{matched}/{total}"
        row["torch_f32_grad_err"] = terr
    except Exception as e:  # noqa: BLE001
        row["status"] = f"imported; run failed: {type(e).__name__}: {str(e)[:150]}"
        if os.environ.get("LEGIONPY_DEBUG"):
            traceback.print_exc()
    return row


def main(argv=None) -> int:
    global B
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=list(MODELS))
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--batch", type=int, default=B)
    args = ap.parse_args(argv)
    B = args.batch
    import torch

    torch.set_num_threads(1)
    print(f"# torch {torch.__version__}; batch {B}; load {os.getloadavg()[0]:.2f}")
    print(f"{'model':20s} {'path':7s} {'predict rel err':>16s} {'grad rel err':>13s} "
          f"{'torch f32':>10s} {'params':>8s}  status")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for how in args.paths.split(","):
                r = run_one(name, how, tmp)
                rows.append(r)
                pe = r.get("predict_rel_err")
                ge = r.get("grad_rel_err")
                te = r.get("torch_f32_grad_err")
                print(f"{name:20s} {how:7s} {'' if pe is None else f'{pe:.1e}':>16s} "
                      f"{'' if ge is None else f'{ge:.1e}':>13s} "
                      f"{'' if te is None else f'{te:.1e}':>10s} "
                      f"{r.get('params_matched', ''):>8s}  {r['status']}", flush=True)
                if r.get("detail") and os.environ.get("LEGIONPY_DEBUG"):
                    print("    ", r["detail"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
