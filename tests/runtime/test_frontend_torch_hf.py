"""Hugging Face models through ``from_torch`` (issue 27 item 6): torch.fx
cannot trace them and transformers 5 has no fx tracer of its own, so the
error says to pass ``via="onnx"``, which exports with torch.onnx (dynamo)
and imports: GPT-2's logits and BERT's hidden states equal torch's.
Skipped without torch, transformers or onnxscript."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxscript")

import legionpy as lp  # noqa: E402
from legionpy.errors import ModelError  # noqa: E402
from legionpy.frontends import from_torch  # noqa: E402
from legionpy.optimizer import Machine  # noqa: E402


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64,
                                      n_positions=16, bos_token_id=0, eos_token_id=0))


def bert():
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=32,
                                intermediate_size=64, vocab_size=64, max_position_embeddings=16),
                     add_pooling_layer=False)


@pytest.mark.parametrize("build", [gpt2, bert])
def test_hf_model_via_onnx_predicts_as_torch(build, rt1):
    torch.manual_seed(0)
    mod = build().eval()
    ids = torch.randint(0, 64, (2, 12))
    with pytest.raises(ModelError, match=r"cannot trace.*transformers.utils.fx.*via='onnx'"):
        from_torch(mod, ids)
    m = from_torch(mod, ids, batch_size=4, via="onnx")  # another batch than the example's
    assert m.imported == {}
    m.compile(loss="mse", machine=Machine.local(1))
    x = torch.randint(0, 64, (4, 12))
    with torch.no_grad():
        out = mod(x)
    want = (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()
    np.testing.assert_allclose(m.predict(x.numpy().astype(np.int32)), want, rtol=1e-4,
                               atol=1e-5)
    assert isinstance(m, lp.nn.Model)
