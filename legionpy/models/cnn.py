"""Convolutional zoo graphs at the paper's shapes (section 8.1): LeNet,
AlexNet, VGG-16, Inception-v3, ResNet-101.

Each builder takes ``b``: anything with the layer methods (an
:class:`~legionpy.optimizer.graph.Graph` or, later, an ``nn.Model``), so the
same code builds the optimizer's graph and the trainable model. Parameter
counts match torchvision (AlexNet 61,100,840; VGG-16 138,357,544;
ResNet-101 44,549,160; Inception-v3 without the auxiliary head 23,834,568).
``width`` scales channel counts (and image sizes are free) for small runs.
"""

from __future__ import annotations

__all__ = ["build_lenet", "build_alexnet", "build_vgg16", "build_inception_v3",
           "build_resnet101"]


def _w(c: int, width: float) -> int:
    return max(1, int(round(c * width)))


def build_lenet(b, image_size: int = 28, channels: int = 1, num_classes: int = 10):
    x = b.input((channels, image_size, image_size), name="image")
    t = b.conv2d(x, 6, 5, padding=2, activation="relu", name="conv1")
    t = b.pool2d(t, 2, name="pool1")
    t = b.conv2d(t, 16, 5, activation="relu", name="conv2")
    t = b.pool2d(t, 2, name="pool2")
    t = b.flat(t, name="flat")
    t = b.dense(t, 120, activation="relu", name="fc1")
    t = b.dense(t, 84, activation="relu", name="fc2")
    t = b.dense(t, num_classes, name="fc3")
    return b.softmax(t, name="softmax")


def build_alexnet(b, image_size: int = 224, num_classes: int = 1000, width: float = 1.0,
                  hidden: int = 4096):
    x = b.input((3, image_size, image_size), name="image")
    t = b.conv2d(x, _w(64, width), 11, stride=4, padding=2, activation="relu", name="conv1")
    t = b.pool2d(t, 3, stride=2, name="pool1")
    t = b.conv2d(t, _w(192, width), 5, padding=2, activation="relu", name="conv2")
    t = b.pool2d(t, 3, stride=2, name="pool2")
    t = b.conv2d(t, _w(384, width), 3, padding=1, activation="relu", name="conv3")
    t = b.conv2d(t, _w(256, width), 3, padding=1, activation="relu", name="conv4")
    t = b.conv2d(t, _w(256, width), 3, padding=1, activation="relu", name="conv5")
    t = b.pool2d(t, 3, stride=2, name="pool5")
    t = b.flat(t, name="flat")
    t = b.dropout(t, 0.5, name="drop6")
    t = b.dense(t, hidden, activation="relu", name="fc6")
    t = b.dropout(t, 0.5, name="drop7")
    t = b.dense(t, hidden, activation="relu", name="fc7")
    t = b.dense(t, num_classes, name="fc8")
    return b.softmax(t, name="softmax")


_VGG16 = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
          512, 512, 512, "M"]


def build_vgg16(b, image_size: int = 224, num_classes: int = 1000, width: float = 1.0,
                hidden: int = 4096):
    t = b.input((3, image_size, image_size), name="image")
    ci = pi = 0
    for v in _VGG16:
        if v == "M":
            pi += 1
            t = b.pool2d(t, 2, stride=2, name=f"pool{pi}")
        else:
            ci += 1
            t = b.conv2d(t, _w(v, width), 3, padding=1, activation="relu", name=f"conv{ci}")
    t = b.flat(t, name="flat")
    t = b.dense(t, hidden, activation="relu", name="fc6")
    t = b.dropout(t, 0.5, name="drop6")
    t = b.dense(t, hidden, activation="relu", name="fc7")
    t = b.dropout(t, 0.5, name="drop7")
    t = b.dense(t, num_classes, name="fc8")
    return b.softmax(t, name="softmax")


def _cbr(b, x, c, k, name, stride=1, padding=0):
    """conv (no bias) + batch_norm with fused relu, as torchvision's BasicConv2d."""
    t = b.conv2d(x, c, k, stride=stride, padding=padding, bias=False, name=f"{name}.conv")
    return b.batch_norm(t, relu=True, name=f"{name}.bn")


def build_inception_v3(b, image_size: int = 299, num_classes: int = 1000, width: float = 1.0):
    W = lambda c: _w(c, width)  # noqa: E731
    x = b.input((3, image_size, image_size), name="image")
    t = _cbr(b, x, W(32), 3, "c1a", stride=2)
    t = _cbr(b, t, W(32), 3, "c2a")
    t = _cbr(b, t, W(64), 3, "c2b", padding=1)
    t = b.pool2d(t, 3, stride=2, name="pool1")
    t = _cbr(b, t, W(80), 1, "c3b")
    t = _cbr(b, t, W(192), 3, "c4a")
    t = b.pool2d(t, 3, stride=2, name="pool2")

    def block_a(t, pf, n):
        a = _cbr(b, t, W(64), 1, f"{n}.b1")
        c = _cbr(b, _cbr(b, t, W(48), 1, f"{n}.b5_1"), W(64), 5, f"{n}.b5_2", padding=2)
        d = _cbr(b, t, W(64), 1, f"{n}.b3_1")
        d = _cbr(b, _cbr(b, d, W(96), 3, f"{n}.b3_2", padding=1), W(96), 3, f"{n}.b3_3",
                 padding=1)
        p = _cbr(b, b.pool2d(t, 3, 1, 1, "avg", name=f"{n}.pool"), W(pf), 1, f"{n}.bp")
        return b.concat([a, c, d, p], axis=1, name=f"{n}.cat")

    def block_b(t, n):
        a = _cbr(b, t, W(384), 3, f"{n}.b3", stride=2)
        d = _cbr(b, t, W(64), 1, f"{n}.d1")
        d = _cbr(b, _cbr(b, d, W(96), 3, f"{n}.d2", padding=1), W(96), 3, f"{n}.d3", stride=2)
        p = b.pool2d(t, 3, stride=2, name=f"{n}.pool")
        return b.concat([a, d, p], axis=1, name=f"{n}.cat")

    def block_c(t, c7, n):
        a = _cbr(b, t, W(192), 1, f"{n}.b1")
        s = _cbr(b, t, c7, 1, f"{n}.s1")
        s = _cbr(b, s, c7, (1, 7), f"{n}.s2", padding=(0, 3))
        s = _cbr(b, s, W(192), (7, 1), f"{n}.s3", padding=(3, 0))
        d = _cbr(b, t, c7, 1, f"{n}.d1")
        for i, (k, p) in enumerate((((7, 1), (3, 0)), ((1, 7), (0, 3)), ((7, 1), (3, 0)))):
            d = _cbr(b, d, c7, k, f"{n}.d{i + 2}", padding=p)
        d = _cbr(b, d, W(192), (1, 7), f"{n}.d5", padding=(0, 3))
        p = _cbr(b, b.pool2d(t, 3, 1, 1, "avg", name=f"{n}.pool"), W(192), 1, f"{n}.bp")
        return b.concat([a, s, d, p], axis=1, name=f"{n}.cat")

    def block_d(t, n):
        a = _cbr(b, _cbr(b, t, W(192), 1, f"{n}.a1"), W(320), 3, f"{n}.a2", stride=2)
        d = _cbr(b, t, W(192), 1, f"{n}.d1")
        d = _cbr(b, d, W(192), (1, 7), f"{n}.d2", padding=(0, 3))
        d = _cbr(b, d, W(192), (7, 1), f"{n}.d3", padding=(3, 0))
        d = _cbr(b, d, W(192), 3, f"{n}.d4", stride=2)
        p = b.pool2d(t, 3, stride=2, name=f"{n}.pool")
        return b.concat([a, d, p], axis=1, name=f"{n}.cat")

    def block_e(t, n):
        a = _cbr(b, t, W(320), 1, f"{n}.b1")
        s = _cbr(b, t, W(384), 1, f"{n}.s1")
        s = b.concat([_cbr(b, s, W(384), (1, 3), f"{n}.s2a", padding=(0, 1)),
                      _cbr(b, s, W(384), (3, 1), f"{n}.s2b", padding=(1, 0))], axis=1,
                     name=f"{n}.scat")
        d = _cbr(b, _cbr(b, t, W(448), 1, f"{n}.d1"), W(384), 3, f"{n}.d2", padding=1)
        d = b.concat([_cbr(b, d, W(384), (1, 3), f"{n}.d3a", padding=(0, 1)),
                      _cbr(b, d, W(384), (3, 1), f"{n}.d3b", padding=(1, 0))], axis=1,
                     name=f"{n}.dcat")
        p = _cbr(b, b.pool2d(t, 3, 1, 1, "avg", name=f"{n}.pool"), W(192), 1, f"{n}.bp")
        return b.concat([a, s, d, p], axis=1, name=f"{n}.cat")

    t = block_a(t, 32, "m5b")
    t = block_a(t, 64, "m5c")
    t = block_a(t, 64, "m5d")
    t = block_b(t, "m6a")
    for n, c7 in (("m6b", 128), ("m6c", 160), ("m6d", 160), ("m6e", 192)):
        t = block_c(t, W(c7), n)
    t = block_d(t, "m7a")
    t = block_e(t, "m7b")
    t = block_e(t, "m7c")
    k = t.shape[2]
    t = b.pool2d(t, k, stride=1, pool_type="avg", name="avgpool")
    t = b.dropout(b.flat(t, name="flat"), 0.5, name="drop")
    t = b.dense(t, num_classes, name="fc")
    return b.softmax(t, name="softmax")


def build_resnet101(b, image_size: int = 224, num_classes: int = 1000, width: float = 1.0,
                    blocks=(3, 4, 23, 3)):
    x = b.input((3, image_size, image_size), name="image")
    t = b.conv2d(x, _w(64, width), 7, stride=2, padding=3, bias=False, name="conv1")
    t = b.batch_norm(t, relu=True, name="bn1")
    t = b.pool2d(t, 3, stride=2, padding=1, name="pool1")
    cin = _w(64, width)
    for li, (n, w) in enumerate(zip(blocks, (64, 128, 256, 512))):
        w = _w(w, width)
        for bi in range(n):
            name = f"l{li + 1}.{bi}"
            stride = 2 if (bi == 0 and li > 0) else 1
            u = b.batch_norm(b.conv2d(t, w, 1, bias=False, name=f"{name}.c1"), relu=True,
                             name=f"{name}.bn1")
            u = b.batch_norm(b.conv2d(u, w, 3, stride=stride, padding=1, bias=False,
                                      name=f"{name}.c2"), relu=True, name=f"{name}.bn2")
            u = b.batch_norm(b.conv2d(u, 4 * w, 1, bias=False, name=f"{name}.c3"),
                             name=f"{name}.bn3")
            if bi == 0:
                t = b.batch_norm(b.conv2d(t, 4 * w, 1, stride=stride, bias=False,
                                          name=f"{name}.down"), name=f"{name}.dbn")
            t = b.relu(b.add(u, t, name=f"{name}.add"), name=f"{name}.relu")
            cin = 4 * w
    k = t.shape[2]
    t = b.flat(b.pool2d(t, k, stride=1, pool_type="avg", name="avgpool"), name="flat")
    t = b.dense(t, num_classes, name="fc")
    del cin
    return b.softmax(t, name="softmax")
