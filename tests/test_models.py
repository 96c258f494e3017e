"""The model registry: every name builds, takes the documented input and gives the documented output."""
import pytest
import torch

from hvdk8s.models import REGISTRY, build, get

CASES = {
    "mlp": ({"hidden": [16]}, {"input_shape": [1, 8, 8], "num_classes": 10}, torch.randn(4, 1, 8, 8), (4, 10)),
    "cnn": ({"channels": [8, 16]}, {"input_shape": [3, 32, 32], "num_classes": 7}, torch.randn(2, 3, 32, 32), (2, 7)),
    "resnet": ({"depth": 8}, {"input_shape": [3, 32, 32], "num_classes": 10}, torch.randn(2, 3, 32, 32), (2, 10)),
    "transformer": ({"d_model": 32, "heads": 4, "layers": 2, "d_ff": 64, "max_len": 16},
                    {"vocab_size": 50, "seq_len": 12}, torch.randint(0, 50, (3, 12)), (3, 12, 50)),
}


def test_every_registered_model_is_tested():
    assert set(REGISTRY) == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_builds_and_maps_input_to_output(name):
    args, data, x, shape = CASES[name]
    model = build(name, "pytorch", args, **data)
    assert model(x).shape == shape
    assert model.__doc__ and "Input" in model.__doc__ and "Output" in model.__doc__


def test_cnn_takes_8x8_digits():
    model = build("cnn", "pytorch", {}, input_shape=[1, 8, 8], num_classes=10)
    assert model(torch.randn(5, 1, 8, 8)).shape == (5, 10)


def test_resnet_depth_sets_the_number_of_blocks():
    def blocks(depth):
        model = build("resnet", "pytorch", {"depth": depth}, input_shape=[3, 32, 32], num_classes=10)
        return sum(type(m).__name__ == "_BasicBlock" for m in model.modules())

    assert (blocks(8), blocks(20), blocks(32)) == (3, 9, 15)


def test_transformer_is_causal():
    torch.manual_seed(0)
    model = build("transformer", "pytorch", {"d_model": 32, "heads": 2, "layers": 1, "d_ff": 32, "max_len": 8},
                  vocab_size=20, seq_len=8).eval()
    a = torch.randint(0, 20, (1, 8))
    b = a.clone()
    b[0, 5:] = (b[0, 5:] + 1) % 20  # change only the future of position 4
    assert torch.allclose(model(a)[0, :5], model(b)[0, :5], atol=1e-6)


def test_unknown_model_and_framework_are_named():
    with pytest.raises(KeyError, match="unknown model 'vgg'"):
        get("vgg")
    with pytest.raises(ValueError, match="no jax builder"):
        build("mlp", "jax", {}, input_shape=[1], num_classes=2)
