"""Bring your own model: a PyTorch network, exported to ONNX, imported,
searched and trained with legionpy; the same network through torch.fx.

    pip install -e ".[torch]"        # torch + onnx (onnxruntime not needed)
    python examples/bring_your_own_model.py [--steps 20]

Writes small_resnet.onnx; then try `legionpy search small_resnet.onnx
--machine p100:4x4` and `legionpy train small_resnet.onnx --steps 20`.
"""

import argparse

import numpy as np
import torch
from torch import nn

import legionpy as lp
from legionpy.optimizer import Machine, Simulator, Strategy, search


class SmallResNet(nn.Module):
    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(16), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False),
                                   nn.BatchNorm2d(16), nn.ReLU(),
                                   nn.Conv2d(16, 16, 3, padding=1, bias=False),
                                   nn.BatchNorm2d(16))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, classes))

    def forward(self, x):
        t = self.stem(x)
        return self.head(torch.relu(t + self.block(t)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    net = SmallResNet().eval()
    x = torch.randn(16, 3, 16, 16)
    torch.onnx.export(net, (x,), "small_resnet.onnx", dynamo=False, opset_version=17)

    # 1. import; predict equals PyTorch's
    lp.init(cpus=2)
    model = lp.frontends.from_onnx("small_resnet.onnx", batch_size=16)
    model.compile(loss="mse")
    with torch.no_grad():
        err = np.abs(model.predict(x.numpy()) - net(x).numpy()).max()
    print(f"imported {len(model.graph.ops)} ops, {model.num_parameters():,} parameters; "
          f"max |legionpy - torch| = {err:.2e}")

    # 2. search a strategy for 16 GPUs (simulated)
    machine = Machine.preset("p100", nodes=4)
    best = search.mcmc(model.graph, machine, iterations=200, seed=0)
    sim = Simulator(model.graph, machine)
    dp = sim.simulate(Strategy.data_parallel(model.graph, machine))
    print(f"p100:4x4: data parallel {dp * 1e3:.2f} ms, searched {sim.simulate(best) * 1e3:.2f} ms")

    # 3. train it here (a softmax appended: the graph ends in logits)
    model = lp.frontends.from_onnx("small_resnet.onnx", batch_size=16, add_softmax=True)
    model.compile(optimizer=lp.nn.Adam(lr=3e-3), metrics=["accuracy"], strategy="data")
    images, labels = lp.data.synthetic.images(16 * args.steps, (3, 16, 16), 4, seed=0)
    h = model.fit(images, labels, epochs=3, verbose=0)
    print(f"train: loss {h['loss'][0]:.3f} -> {h['loss'][-1]:.3f}, "
          f"accuracy {h['accuracy'][-1]:.2f}")

    # 4. the same network straight from PyTorch, through torch.fx
    m2 = lp.frontends.from_torch(net, x)
    m2.compile(loss="mse")
    with torch.no_grad():
        err = np.abs(m2.predict(x.numpy()) - net(x).numpy()).max()
    print(f"from_torch: max |legionpy - torch| = {err:.2e}")
    lp.runtime.shutdown()


if __name__ == "__main__":
    main()
