"""TensorFlow's tf.distribute.MultiWorkerMirroredStrategy: two worker processes on
127.0.0.1 (TF_CONFIG from the caller), one CPU each, averaging the same step's gradient as
tf_mirrored.py. Prints JSON from each worker: its index, the all-reduce's class name and
the averaged gradients."""

import json
import os
import sys

from tf_mirrored import problem


def main() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    w1, b1, w2, b2, x, y = problem()
    with strategy.scope():
        params = [tf.Variable(v) for v in (w1, b1, w2, b2)]
    xs, ys = x[4 * index:][:4], y[4 * index:][:4]

    @tf.function
    def replica_step():
        with tf.GradientTape() as tape:
            h = tf.tanh(tf.matmul(xs, params[0], transpose_b=True) + params[1])
            out = tf.matmul(h, params[2], transpose_b=True) + params[3]
            loss = tf.reduce_mean(tf.square(out - ys))
        grads = tape.gradient(loss, params)
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN,
                                                              grads)

    averaged = strategy.run(replica_step)
    reducer = type(strategy.extended._cross_device_ops).__name__
    json.dump({"index": index, "cross_device_ops": reducer,
               "replicas": strategy.num_replicas_in_sync,
               "grads": [strategy.experimental_local_results(g)[0].numpy().tolist()
                         for g in averaged]}, sys.stdout)


if __name__ == "__main__":
    main()
