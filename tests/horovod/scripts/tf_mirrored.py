"""TensorFlow's tf.distribute.MirroredStrategy on two logical CPU devices, for
tests/horovod/test_tensorflow.py: the same small model and data as the test's torch side
(weights and batch from numpy with a fixed seed), one step's gradient averaged over the two
replicas by the strategy's all-reduce. Prints JSON: the cross-device op's class name, the
devices, and the averaged gradients."""

import json
import os
import sys

import numpy as np


def problem(seed: int = 0):
    """Weights of a 4-8-2 tanh network and a global batch of 8 (float32)."""
    rng = np.random.default_rng(seed)
    w1, b1 = rng.standard_normal((8, 4)), rng.standard_normal(8)
    w2, b2 = rng.standard_normal((2, 8)), rng.standard_normal(2)
    x, y = rng.standard_normal((8, 4)), rng.standard_normal((8, 2))
    return [a.astype(np.float32) for a in (w1, b1, w2, b2, x, y)]


def main() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf  # here, so that the tests can import problem() without it

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    strategy = tf.distribute.MirroredStrategy(devices)
    w1, b1, w2, b2, x, y = problem()
    with strategy.scope():
        params = [tf.Variable(v) for v in (w1, b1, w2, b2)]
    shards = strategy.experimental_distribute_values_from_function(
        lambda ctx: (x[4 * ctx.replica_id_in_sync_group:][:4],
                     y[4 * ctx.replica_id_in_sync_group:][:4]))

    def replica_step(batch):
        xs, ys = batch
        with tf.GradientTape() as tape:
            h = tf.tanh(tf.matmul(xs, params[0], transpose_b=True) + params[1])
            out = tf.matmul(h, params[2], transpose_b=True) + params[3]
            loss = tf.reduce_mean(tf.square(out - ys))  # this replica's mean, as DDP's
        grads = tape.gradient(loss, params)
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce(tf.distribute.ReduceOp.MEAN, grads)

    averaged = strategy.run(replica_step, args=(shards,))
    per_replica = [strategy.experimental_local_results(g) for g in averaged]
    # the cross-device op the strategy picks for these (float) gradients
    reducer = type(strategy.extended._get_cross_device_ops(averaged[0])).__name__
    json.dump({"cross_device_ops": reducer,
               "devices": devices, "replicas": strategy.num_replicas_in_sync,
               "grads": [[r.numpy().tolist() for r in g] for g in per_replica]}, sys.stdout)


if __name__ == "__main__":
    main()
