"""Keras 3 definitions of the registry's models: the same architectures as `torch_models`, built from
the same arguments. Image inputs arrive as (N, C, H, W), as in PyTorch, and are transposed to
channels-last inside the model (TensorFlow's CPU convolutions support only NHWC)."""
from __future__ import annotations

import keras
from keras import layers, ops

from .registry import CNNArgs, MLPArgs, ResNetArgs, TransformerArgs


def _images(input_shape) -> tuple[keras.KerasTensor, keras.KerasTensor]:
    inputs = keras.Input(tuple(input_shape))
    x = layers.Permute((2, 3, 1))(inputs) if len(input_shape) == 3 else inputs
    return inputs, x


def build_mlp(args: MLPArgs, *, input_shape, num_classes, **_) -> keras.Model:
    """Input: float (N, *input_shape), flattened. Output: class logits (N, num_classes)."""
    inputs = keras.Input(tuple(input_shape))
    x = layers.Flatten()(inputs)
    for h in args.hidden:
        x = layers.Dense(h, activation="relu")(x)
        if args.dropout:
            x = layers.Dropout(args.dropout)(x)
    return keras.Model(inputs, layers.Dense(num_classes)(x), name="mlp")


def build_cnn(args: CNNArgs, *, input_shape, num_classes, **_) -> keras.Model:
    """Input: images (N, C, H, W). Output: class logits (N, num_classes). conv3x3 + BN + ReLU stages,
    halving the resolution while it is above 4x4, then a 2x2 average pool and a hidden layer."""
    inputs, x = _images(input_shape)
    size = input_shape[-1]
    for c in args.channels:
        x = layers.Conv2D(c, 3, padding="same", use_bias=False)(x)
        x = layers.ReLU()(layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x))
        if size > 4:
            x = layers.MaxPooling2D(2)(x)
            size //= 2
    x = layers.AveragePooling2D(pool_size=size // 2)(x) if size >= 2 else x
    x = layers.Flatten()(x)
    x = layers.Dense(args.hidden, activation="relu")(x)
    x = layers.Dropout(args.dropout)(x) if args.dropout else x
    return keras.Model(inputs, layers.Dense(num_classes)(x), name="cnn")


def _basic_block(x, c: int, stride: int):
    shortcut = x
    y = layers.Conv2D(c, 3, stride, padding="same", use_bias=False, kernel_initializer="he_normal")(x)
    y = layers.ReLU()(layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(y))
    y = layers.Conv2D(c, 3, 1, padding="same", use_bias=False, kernel_initializer="he_normal")(y)
    y = layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(y)
    if stride != 1 or x.shape[-1] != c:
        shortcut = layers.Conv2D(c, 1, stride, use_bias=False, kernel_initializer="he_normal")(x)
        shortcut = layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(shortcut)
    return layers.ReLU()(layers.Add()([y, shortcut]))


def build_resnet(args: ResNetArgs, *, input_shape, num_classes, **_) -> keras.Model:
    """CIFAR-style ResNet, depth = 6n + 2. Input: images (N, C, H, W). Output: logits (N, num_classes)."""
    inputs, x = _images(input_shape)
    n = (args.depth - 2) // 6
    widths = [16 * args.width, 32 * args.width, 64 * args.width]
    x = layers.Conv2D(widths[0], 3, padding="same", use_bias=False, kernel_initializer="he_normal")(x)
    x = layers.ReLU()(layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x))
    for stage, c in enumerate(widths):
        for block in range(n):
            x = _basic_block(x, c, 2 if stage > 0 and block == 0 else 1)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(num_classes)(x), name="resnet")


class _TiedOutput(layers.Layer):
    """Next-token logits from the embedding matrix (weights tied, as in the PyTorch model)."""

    def __init__(self, embedding: layers.Embedding, **kw):
        super().__init__(**kw)
        self.embedding = embedding

    def call(self, h):
        return ops.matmul(h, ops.transpose(self.embedding.embeddings))


class _Positions(layers.Layer):
    def __init__(self, max_len: int, d_model: int, **kw):
        super().__init__(**kw)
        self.table = self.add_weight(shape=(max_len, d_model),
                                     initializer=keras.initializers.RandomNormal(stddev=0.02), name="positions")

    def call(self, x):
        return x + self.table[: ops.shape(x)[1]]


def build_transformer(args: TransformerArgs, *, vocab_size, seq_len, **_) -> keras.Model:
    """Decoder-only LM (pre-norm, causal attention, learned positions, tied output).
    Input: token ids (N, T). Output: next-token logits (N, T, vocab_size)."""
    if seq_len > args.max_len:
        raise ValueError(f"model.args.max_len ({args.max_len}) is below the dataset's sequence length ({seq_len})")
    tokens = keras.Input((seq_len,), dtype="int64")
    embed = layers.Embedding(vocab_size, args.d_model)
    h = _Positions(args.max_len, args.d_model)(embed(tokens))
    for _ in range(args.layers):
        a = layers.LayerNormalization(epsilon=1e-5)(h)
        a = layers.MultiHeadAttention(args.heads, args.d_model // args.heads, dropout=args.dropout)(
            a, a, use_causal_mask=True)
        h = layers.Add()([h, layers.Dropout(args.dropout)(a) if args.dropout else a])
        f = layers.LayerNormalization(epsilon=1e-5)(h)
        f = layers.Dense(args.d_model)(layers.Dense(args.d_ff, activation="relu")(f))
        h = layers.Add()([h, layers.Dropout(args.dropout)(f) if args.dropout else f])
    logits = _TiedOutput(embed)(layers.LayerNormalization(epsilon=1e-5)(h))
    return keras.Model(tokens, logits, name="transformer")
