"""torchvision-architecture CNNs in plain torch.nn (no torchvision), owned by the tests.

Each builder takes `size`: "ci" (reduced widths / depths, 32x32 input, seconds to compile) or
"full" (torchvision's widths and depths at 224x224). Weights are deterministic
(`torch.manual_seed`); every BatchNorm gets random affine gamma / beta and real running statistics
from a few seeded random batches run through the model in training mode (so mean != 0, var != 1
and BN folding is actually exercised); the model is returned in eval mode.

`Dropout` here is `ExportedDropout`: identity in eval, as nn.Dropout, but it writes an ONNX
`Dropout` node (with its unused mask output) the way non-PyTorch exporters and training-mode
exports do; torch.onnx drops an eval-mode nn.Dropout silently, so nothing would test it.

    from tests.zoo.models import MODELS, build
    model, input_shape = build("resnet18", "ci")
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

SIZES = ("ci", "full")


# --------------------------------------------------------------------------- shared pieces


class _DropoutFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p: float):  # eval: identity
        return x.clone()

    @staticmethod
    def symbolic(g, x, p: float):
        opset = g.opset  # the opset being exported (GraphContext)
        if opset >= 12:
            ratio = g.op("Constant", value_t=torch.tensor(p, dtype=torch.float32))
            training = g.op("Constant", value_t=torch.tensor(False))
            out, _mask = g.op("Dropout", x, ratio, training, outputs=2)
        else:
            out, _mask = g.op("Dropout", x, ratio_f=p, outputs=2)
        return out


class ExportedDropout(nn.Dropout):
    """nn.Dropout that shows up in the ONNX graph as a Dropout node (inference: identity)."""

    def forward(self, x):
        if self.training:
            return super().forward(x)
        if torch.onnx.is_in_onnx_export():
            return _DropoutFn.apply(x, float(self.p))
        return x


Dropout = ExportedDropout


def conv_bn(cin: int, cout: int, k: int, stride: int = 1, pad: int | None = None, groups: int = 1,
            act: type[nn.Module] | None = nn.ReLU) -> nn.Sequential:
    pad = (k - 1) // 2 if pad is None else pad
    layers = [nn.Conv2d(cin, cout, k, stride, pad, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act(inplace=True) if act in (nn.ReLU, nn.ReLU6, nn.SiLU) else act())
    return nn.Sequential(*layers)


def _make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


def _w(c: int, mult: float, divisor: int = 4) -> int:
    return _make_divisible(c * mult, divisor)


# --------------------------------------------------------------------------- ResNet


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (conv_bn(cin, cout, 1, stride, 0, act=None) if stride != 1 or cin != cout else None)

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + idt)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)  # stride on the 3x3 (ResNet v1.5)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (conv_bn(cin, cout, 1, stride, 0, act=None) if stride != 1 or cin != cout else None)

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + idt)


class ResNet(nn.Module):
    def __init__(self, block, layers, base: int = 64, classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, base, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(base)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin, stages = base, []
        for i, n in enumerate(layers):
            width = base * 2 ** i
            blocks = []
            for j in range(n):
                blocks.append(block(cin, width, 2 if (i > 0 and j == 0) else 1))
                cin = width * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(size: str):
    if size == "full":
        return ResNet(BasicBlock, (2, 2, 2, 2)), (1, 3, 224, 224)
    return ResNet(BasicBlock, (2, 2, 2, 2), base=8, classes=10), (1, 3, 32, 32)


def resnet50(size: str):
    if size == "full":
        return ResNet(Bottleneck, (3, 4, 6, 3)), (1, 3, 224, 224)
    return ResNet(Bottleneck, (1, 2, 2, 1), base=8, classes=10), (1, 3, 32, 32)


# --------------------------------------------------------------------------- MobileNetV2


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = int(round(cin * expand))
        self.use_res = stride == 1 and cin == cout
        layers = [] if expand == 1 else [conv_bn(cin, hidden, 1, act=nn.ReLU6)]
        layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
                   conv_bn(hidden, cout, 1, act=None)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))  # t, c, n, s

    def __init__(self, width: float = 1.0, classes: int = 1000, depth: Callable[[int], int] = lambda n: n,
                 last: int = 1280):
        super().__init__()
        cin = _make_divisible(32 * width)
        last = _make_divisible(last * max(1.0, width))
        layers = [conv_bn(3, cin, 3, 2, act=nn.ReLU6)]
        for t, c, n, s in self.SETTINGS:
            cout = _make_divisible(c * width)
            for i in range(depth(n)):
                layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        layers.append(conv_bn(cin, last, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(Dropout(0.2), nn.Linear(last, classes))

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v2(size: str):
    if size == "full":
        return MobileNetV2(), (1, 3, 224, 224)
    return MobileNetV2(width=0.25, classes=10, depth=lambda n: min(n, 2), last=128), (1, 3, 32, 32)


# --------------------------------------------------------------------------- SqueezeNet 1.1


class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, e1: int, e3: int):
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.expand1x1 = nn.Conv2d(squeeze, e1, 1)
        self.expand3x3 = nn.Conv2d(squeeze, e3, 3, padding=1)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        x = self.act(self.squeeze(x))
        return torch.cat([self.act(self.expand1x1(x)), self.act(self.expand3x3(x))], 1)


class SqueezeNet11(nn.Module):
    def __init__(self, width: float = 1.0, classes: int = 1000):
        super().__init__()
        w = lambda c: _w(c, width)  # noqa: E731
        fire = lambda cin, s, e: Fire(w(cin), w(s), w(e), w(e))  # noqa: E731
        self.features = nn.Sequential(
            nn.Conv2d(3, w(64), 3, 2), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            fire(64, 16, 64), fire(128, 16, 64),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            fire(128, 32, 128), fire(256, 32, 128),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            fire(256, 48, 192), fire(384, 48, 192), fire(384, 64, 256), fire(512, 64, 256))
        self.classifier = nn.Sequential(Dropout(0.5), nn.Conv2d(w(512), classes, 1), nn.ReLU(inplace=True),
                                        nn.AdaptiveAvgPool2d((1, 1)))

    def forward(self, x):
        return torch.flatten(self.classifier(self.features(x)), 1)


def squeezenet1_1(size: str):
    if size == "full":
        return SqueezeNet11(), (1, 3, 224, 224)
    return SqueezeNet11(width=0.125, classes=10), (1, 3, 48, 48)


# --------------------------------------------------------------------------- VGG-11 (with BN)


class VGG(nn.Module):
    CFG_A = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")

    def __init__(self, width: float = 1.0, classes: int = 1000, hidden: int = 4096, pool: int = 7):
        super().__init__()
        layers, cin = [], 3
        for v in self.CFG_A:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers.append(conv_bn(cin, _w(v, width), 3))
                cin = _w(v, width)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((pool, pool))
        self.classifier = nn.Sequential(
            nn.Linear(cin * pool * pool, hidden), nn.ReLU(True), Dropout(0.5),
            nn.Linear(hidden, hidden), nn.ReLU(True), Dropout(0.5), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def vgg11(size: str):
    if size == "full":
        return VGG(), (1, 3, 224, 224)
    return VGG(width=0.125, classes=10, hidden=64, pool=1), (1, 3, 32, 32)


# --------------------------------------------------------------------------- DenseNet-121


class DenseLayer(nn.Module):
    def __init__(self, cin: int, growth: int, bn_size: int):
        super().__init__()
        self.norm1, self.relu1 = nn.BatchNorm2d(cin), nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2, self.relu2 = nn.BatchNorm2d(bn_size * growth), nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, 1, 1, bias=False)

    def forward(self, feats: list[torch.Tensor]):
        x = torch.cat(feats, 1)
        return self.conv2(self.relu2(self.norm2(self.conv1(self.relu1(self.norm1(x))))))


class DenseBlock(nn.ModuleList):
    def __init__(self, n: int, cin: int, growth: int, bn_size: int):
        super().__init__([DenseLayer(cin + i * growth, growth, bn_size) for i in range(n)])

    def forward(self, x):
        feats = [x]
        for layer in self:
            feats.append(layer(feats))
        return torch.cat(feats, 1)


class DenseNet(nn.Module):
    def __init__(self, growth: int = 32, blocks=(6, 12, 24, 16), init: int = 64, bn_size: int = 4,
                 classes: int = 1000):
        super().__init__()
        layers = [nn.Conv2d(3, init, 7, 2, 3, bias=False), nn.BatchNorm2d(init), nn.ReLU(inplace=True),
                  nn.MaxPool2d(3, 2, 1)]
        c = init
        for i, n in enumerate(blocks):
            layers.append(DenseBlock(n, c, growth, bn_size))
            c += n * growth
            if i != len(blocks) - 1:
                layers += [nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.Conv2d(c, c // 2, 1, bias=False),
                           nn.AvgPool2d(2, 2)]
                c //= 2
        layers += [nn.BatchNorm2d(c)]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c, classes)

    def forward(self, x):
        x = F.relu(self.features(x))
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1))


def densenet121(size: str):
    if size == "full":
        return DenseNet(), (1, 3, 224, 224)
    return DenseNet(growth=4, blocks=(2, 3, 4, 2), init=8, bn_size=2, classes=10), (1, 3, 32, 32)


# --------------------------------------------------------------------------- GoogLeNet (Inception v1)


class Inception(nn.Module):
    def __init__(self, cin: int, c1: int, c3r: int, c3: int, c5r: int, c5: int, pp: int):
        super().__init__()
        self.branch1 = conv_bn(cin, c1, 1)
        self.branch2 = nn.Sequential(conv_bn(cin, c3r, 1), conv_bn(c3r, c3, 3))
        self.branch3 = nn.Sequential(conv_bn(cin, c5r, 1), conv_bn(c5r, c5, 3))  # torchvision: 3x3 here too
        self.branch4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), conv_bn(cin, pp, 1))

    def forward(self, x):
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


class GoogLeNet(nn.Module):
    BLOCKS = {"3a": (192, 64, 96, 128, 16, 32, 32), "3b": (256, 128, 128, 192, 32, 96, 64),
              "4a": (480, 192, 96, 208, 16, 48, 64), "4b": (512, 160, 112, 224, 24, 64, 64),
              "4c": (512, 128, 128, 256, 24, 64, 64), "4d": (512, 112, 144, 288, 32, 64, 64),
              "4e": (528, 256, 160, 320, 32, 128, 128), "5a": (832, 256, 160, 320, 32, 128, 128),
              "5b": (832, 384, 192, 384, 48, 128, 128)}

    def __init__(self, width: float = 1.0, classes: int = 1000, blocks=tuple(BLOCKS)):
        super().__init__()
        w = lambda c: _w(c, width)  # noqa: E731
        self.stem = nn.Sequential(conv_bn(3, w(64), 7, 2, 3), nn.MaxPool2d(3, 2, ceil_mode=True),
                                  conv_bn(w(64), w(64), 1), conv_bn(w(64), w(192), 3),
                                  nn.MaxPool2d(3, 2, ceil_mode=True))
        layers, cin = [], w(192)
        for name in blocks:
            if name in ("4a", "5a"):
                layers.append(nn.MaxPool2d(3 if name == "4a" else 2, 2, ceil_mode=True))
            spec = [w(c) for c in self.BLOCKS[name][1:]]
            layers.append(Inception(cin, *spec))
            cin = spec[0] + spec[2] + spec[4] + spec[5]
        self.inception = nn.Sequential(*layers)
        self.dropout = Dropout(0.2)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.inception(self.stem(x))
        x = torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1)
        return self.fc(self.dropout(x))


def googlenet(size: str):
    if size == "full":
        return GoogLeNet(), (1, 3, 224, 224)
    return GoogLeNet(width=0.125, classes=10, blocks=("3a", "3b", "4a", "5a")), (1, 3, 64, 64)


# --------------------------------------------------------------------------- ShuffleNetV2


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    n, c, h, w = x.shape
    x = x.view(n, groups, c // groups, h, w)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(n, c, h, w)


class ShuffleUnit(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.stride = stride
        bf = cout // 2
        if stride > 1:
            self.branch1 = nn.Sequential(conv_bn(cin, cin, 3, stride, groups=cin, act=None),
                                         conv_bn(cin, bf, 1))
        self.branch2 = nn.Sequential(conv_bn(cin if stride > 1 else bf, bf, 1),
                                     conv_bn(bf, bf, 3, stride, groups=bf, act=None), conv_bn(bf, bf, 1))

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), 1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), 1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    def __init__(self, repeats=(4, 8, 4), channels=(24, 116, 232, 464, 1024), classes: int = 1000):
        super().__init__()
        self.conv1 = conv_bn(3, channels[0], 3, 2)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin, stages = channels[0], []
        for n, cout in zip(repeats, channels[1:4]):
            stages.append(nn.Sequential(*[ShuffleUnit(cin if i == 0 else cout, cout, 2 if i == 0 else 1)
                                          for i in range(n)]))
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.conv5 = conv_bn(cin, channels[4], 1)
        self.fc = nn.Linear(channels[4], classes)

    def forward(self, x):
        x = self.conv5(self.stages(self.maxpool(self.conv1(x))))
        return self.fc(x.mean([2, 3]))  # torchvision: a mean over H, W (ReduceMean)


def shufflenet_v2(size: str):
    if size == "full":
        return ShuffleNetV2(), (1, 3, 224, 224)
    return ShuffleNetV2(repeats=(2, 2, 1), channels=(8, 16, 32, 64, 128), classes=10), (1, 3, 32, 32)


# --------------------------------------------------------------------------- EfficientNet-B0


class SqueezeExcite(nn.Module):
    def __init__(self, c: int, squeeze: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1)
        self.act, self.gate = nn.SiLU(inplace=True), nn.Sigmoid()

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.fc2(self.act(self.fc1(s))))


class MBConv(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        layers = [] if expand == 1 else [conv_bn(cin, hidden, 1, act=nn.SiLU)]
        layers += [conv_bn(hidden, hidden, k, stride, groups=hidden, act=nn.SiLU),
                   SqueezeExcite(hidden, max(1, cin // 4)), conv_bn(hidden, cout, 1, act=None)]
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.block(x) if self.use_res else self.block(x)  # stochastic depth: identity in eval


class EfficientNet(nn.Module):
    SETTINGS = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
                (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))  # expand, kernel, stride, channels, repeats (B0)

    def __init__(self, width: float = 1.0, depth: Callable[[int], int] = lambda n: n, classes: int = 1000,
                 stages: int = 7, last: int = 1280):
        super().__init__()
        cin = _make_divisible(32 * width)
        layers = [conv_bn(3, cin, 3, 2, act=nn.SiLU)]
        for e, k, s, c, n in self.SETTINGS[:stages]:
            cout = _make_divisible(c * width)
            for i in range(depth(n)):
                layers.append(MBConv(cin, cout, k, s if i == 0 else 1, e))
                cin = cout
        last = _make_divisible(last * width) if width < 1 else last
        layers.append(conv_bn(cin, last, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(Dropout(0.2), nn.Linear(last, classes))

    def forward(self, x):
        x = torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1)
        return self.classifier(x)


def efficientnet_b0(size: str):
    if size == "full":
        return EfficientNet(), (1, 3, 224, 224)
    return EfficientNet(width=0.25, depth=lambda n: 1, classes=10, stages=6, last=512), (1, 3, 32, 32)


# --------------------------------------------------------------------------- registry

MODELS: dict[str, Callable[[str], tuple[nn.Module, tuple[int, ...]]]] = {
    "resnet18": resnet18, "resnet50": resnet50, "mobilenet_v2": mobilenet_v2, "squeezenet1_1": squeezenet1_1,
    "vgg11": vgg11, "densenet121": densenet121, "googlenet": googlenet, "shufflenet_v2": shufflenet_v2,
    "efficientnet_b0": efficientnet_b0,
}


def _init(model: nn.Module, shape: tuple[int, ...], seed: int) -> None:
    """Kaiming weights as torchvision initialises them, random BN gamma / beta, then BN running
    statistics measured on seeded random batches (cumulative average), as training would leave
    them: every BN's eval-mode output is then ~ gamma * N(0, 1) + beta, however deep the model."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu", generator=g)
            if m.bias is not None:
                nn.init.normal_(m.bias, 0.0, 0.05, generator=g)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, (1.0 / m.in_features) ** 0.5, generator=g)
            nn.init.normal_(m.bias, 0.0, 0.05, generator=g)
        elif isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # cumulative moving average over the calibration batches
            with torch.no_grad():
                m.weight.copy_(torch.empty_like(m.weight).uniform_(0.5, 1.5, generator=g))
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.2)
    model.train()
    batch = (4,) + tuple(shape[1:])
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(batch, generator=g))
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum = 0.1
    model.eval()


def build(name: str, size: str = "ci", seed: int = 0) -> tuple[nn.Module, tuple[int, ...]]:
    """(model in eval mode with deterministic weights and BN statistics, input shape NCHW)."""
    if name not in MODELS:
        raise KeyError(f"unknown zoo model {name!r} (have: {', '.join(MODELS)})")
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, not {size!r}")
    torch.manual_seed(seed)
    model, shape = MODELS[name](size)
    _init(model, shape, seed)
    return model, shape


def example_input(shape: tuple[int, ...], seed: int = 1) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))
