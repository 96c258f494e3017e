"""Model factories: called with the job file's `model.args`, plus whichever of input_shape,
num_classes, vocab_size and seq_len they accept (read off the dataset)."""


def torch_mlp(hidden: int, num_classes: int, input_shape: list):
    import math

    import torch

    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(math.prod(input_shape), hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, num_classes))


def keras_mlp(hidden: int, num_classes: int, input_shape: list):
    import keras

    inputs = keras.Input(tuple(input_shape))
    x = keras.layers.Dense(hidden, activation="tanh")(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))
