"""Your own Keras 3 training script with hvdk8s's Horovod layer, models and tf.data pipelines.

    horovodrun -np 2 -H localhost:2 python examples/custom_keras.py [CHECKPOINT_DIR] [EPOCHS]
"""
import sys

import keras

import hvdk8s.tensorflow as htf
from hvdk8s.data.datasets import digits, train_test_split
from hvdk8s.data.tensorflow import sharded_dataset
from hvdk8s.models import build

ckpt_dir = sys.argv[1] if len(sys.argv) > 1 else "checkpoints/custom-keras"
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 10

htf.init()  # CPU: cores / local ranks threads each; GPU: the local rank's device, with memory growth
keras.utils.set_random_seed(0)
model = build("cnn", "tensorflow", {"channels": [16, 32]}, input_shape=[1, 8, 8], num_classes=10)
lr = htf.scaled_learning_rate(0.05)  # x ranks
optimizer = htf.distribute(model, keras.optimizers.SGD(lr, momentum=0.9))  # rank 0's weights; averaged grads
model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"], jit_compile=False)  # Horovod's ops have no XLA kernels
start, _ = htf.load_checkpoint(ckpt_dir, model, optimizer)  # rank 0 reads, all ranks get it

train, test = train_test_split(digits(), 0.2)
data = sharded_dataset(train, 32, rank=htf.rank(), size=htf.size(), seed=0, first_epoch=start + 1)
model.fit(data, epochs=epochs, initial_epoch=start, verbose=0, shuffle=False,  # reordered per epoch already
          callbacks=[*htf.callbacks(),  # broadcast from rank 0 at the start, metrics averaged over ranks
                     htf.LearningRateWarmup(0.05, lr, warmup_epochs=1, steps_per_epoch=len(data)),
                     htf.Checkpoint(ckpt_dir)])  # rank 0 only, atomic

correct = 0
for x, y in sharded_dataset(test, 256, rank=htf.rank(), size=htf.size(), shuffle=False):
    correct += int((keras.ops.argmax(model(x, training=False), -1).numpy() == y.numpy()).sum())
htf.log(f"test accuracy {htf.metric_sum(correct) / len(test):.2%}")  # printed by rank 0 only
