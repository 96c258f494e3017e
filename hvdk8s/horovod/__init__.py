"""Horovod's own APIs where this project's frameworks broke them: `hvdk8s.horovod.tensorflow` (and its
`keras`) is Horovod 0.28.1's TensorFlow 2 API on Keras 3. A Horovod script changes one import, by a prefix:

    import hvdk8s.horovod.tensorflow as hvd          # was: import horovod.tensorflow as hvd
    import hvdk8s.horovod.tensorflow.keras as hvd    # was: import horovod.tensorflow.keras as hvd

PyTorch needs nothing here: `horovod.torch` works unchanged with this project's torch.
"""
