"""Makes the TensorFlow/Keras golden files under tests/data/ that tests/test_tf_*.py read without TensorFlow.

Run once, in a separate environment with TensorFlow (never needed by the tests):
    python3 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install tensorflow-cpu==2.21.0 tf-keras==2.21.0 h5py numpy
    /tmp/tfenv/bin/python tools/tf_port/make_goldens.py [tests/data]

Writes:
* tf2_dtypes/ (tf.train.Checkpoint with every dtype), tf1_partitioned/ (TF 1.x Saver, sharded, a partitioned
  variable), tf_checkpoint_values.npz (the values, as TensorFlow reads them back);
* saved_model/ (tf.saved_model.save of a tf.Module; its values are in tf_checkpoint_values.npz too);
* tf1_model/ + tf1_model.npz: worked example (a), a TF 1.x graph (contrib-style fused batch norm with
  center only, then a 2-layer LSTM whose variables are those tf.contrib.cudnn_rnn's CudnnLSTM saveable
  writes, `cudnn_compatible_lstm_cell` kernels and biases), saved with Saver; inputs, TF's inference outputs
  and the moving statistics after one training step;
* keras_model.keras, keras_model.h5 (tf.keras whole model), keras_weights.h5 (tf.keras save_weights),
  keras_model.npz: worked example (b), Conv2D, BatchNormalization, Bidirectional(LSTM), GRU(reset_after=True),
  GRU(reset_after=False);
* keras3_nested.{keras,h5,weights.h5}, tfkeras_nested.h5, keras_nested.npz: a Bidirectional layer and a
  nested model in every Keras file layout, and `model.get_weights()`.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data")


def checkpoints(values):
    vs = {}
    for dt in [tf.float32, tf.float64, tf.int32, tf.uint8, tf.int16, tf.int8, tf.complex64, tf.int64, tf.bool,
               tf.bfloat16, tf.uint16, tf.complex128, tf.float16, tf.uint32, tf.uint64, tf.string]:
        if dt == tf.string:
            v = tf.constant([[b"ab", b""], [b"\x00\xff", b"xyz"]])
        elif dt == tf.bool:
            v = tf.constant([True, False, True])
        elif dt.is_complex:
            v = tf.complex(tf.reshape(tf.range(6.0), [2, 3]), -tf.reshape(tf.range(6.0), [2, 3]))
            v = tf.cast(v, dt)
        else:
            v = tf.cast(tf.reshape(tf.range(6), [2, 3]) * 3 - (0 if dt.is_unsigned else 5), dt)
        vs[dt.name] = tf.Variable(v)
    vs["scalar"] = tf.Variable(3.5)
    vs["empty"] = tf.Variable(tf.zeros([0, 4]))
    prefix = tf.train.Checkpoint(**vs).write(os.path.join(OUT, "tf2_dtypes", "ckpt"))
    reader = tf.train.load_checkpoint(prefix)
    for name in reader.get_variable_to_shape_map():
        if reader.get_variable_to_dtype_map()[name] == tf.string:
            continue
        t = reader.get_tensor(name)
        if reader.get_variable_to_dtype_map()[name] == tf.bfloat16:
            t = t.astype(np.float32)
        values["tf2/" + name.replace("/", "|")] = t

    g = tf.Graph()
    with g.as_default():
        init = tf.compat.v1.random_normal_initializer(seed=1)
        part = tf.compat.v1.get_variable("part", shape=[10, 3], initializer=init,
                                         partitioner=tf.compat.v1.fixed_size_partitioner(3))
        tf.compat.v1.get_variable("w", shape=[2], initializer=tf.compat.v1.ones_initializer())
        step = tf.compat.v1.train.get_or_create_global_step()
        saver = tf.compat.v1.train.Saver(sharded=True)
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            s.run(step.assign(7))
            d = os.path.join(OUT, "tf1_partitioned")
            os.makedirs(d, exist_ok=True)
            saver.save(s, os.path.join(d, "model.ckpt"), global_step=7, write_meta_graph=False)
            values["tf1/part"] = s.run(tf.convert_to_tensor(part))


def saved_model(values):
    """A TF 2.x SavedModel of a small tf.Module: its variables/ bundle has object-based names."""
    class Dense(tf.Module):
        def __init__(self):
            super().__init__()
            self.kernel = tf.Variable(tf.reshape(tf.range(6.0), [3, 2]) / 4)
            self.bias = tf.Variable([0.5, -1.5], dtype=tf.float64)

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
        def __call__(self, x):
            return x @ self.kernel

    d = os.path.join(OUT, "saved_model")
    tf.saved_model.save(Dense(), d)
    reader = tf.train.load_checkpoint(os.path.join(d, "variables", "variables"))
    for name in reader.get_variable_to_shape_map():
        if reader.get_variable_to_dtype_map()[name] != tf.string:
            values["saved_model/" + name.replace("/", "|")] = reader.get_tensor(name)


def tf1_model():
    """Worked example (a): NHWC images -> contrib-style fused batch norm (center only: beta, moving stats)
    -> rows as a time-major sequence -> 2-layer LSTM in the CudnnLSTM saveable's variables."""
    rng = np.random.default_rng(51)
    B, H, W, C, U = 3, 5, 4, 2, 6
    x = rng.standard_normal((B, H, W, C)).astype(np.float32) * 2 + 0.5
    g = tf.Graph()
    out = {"x": x}
    with g.as_default():
        xt = tf.constant(x)
        with tf.compat.v1.variable_scope("BatchNorm"):
            beta = tf.compat.v1.get_variable("beta", initializer=rng.standard_normal(C).astype(np.float32))
            mm = tf.compat.v1.get_variable("moving_mean", initializer=rng.standard_normal(C).astype(np.float32),
                                           trainable=False)
            mv = tf.compat.v1.get_variable("moving_variance", initializer=rng.uniform(0.5, 2, C).astype(np.float32),
                                           trainable=False)
        ones = tf.ones([C])
        # inference: the fused op with the moving statistics (tf.contrib.layers.batch_norm, is_training=False)
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(xt, ones, beta, mean=mm, variance=mv, epsilon=1e-3,
                                                   is_training=False)
        # one training step: the raw op's running update (Bessel-corrected variance), TF momentum 0.9
        yt, new_mean, new_var, _, _, _ = tf.raw_ops.FusedBatchNormV3(
            x=xt, scale=ones, offset=beta, mean=mm, variance=mv, epsilon=1e-3, exponential_avg_factor=0.1,
            data_format="NHWC", is_training=True)
        seq = tf.transpose(tf.reshape(y, [B, H, W * C]), [1, 0, 2])  # [T=H, B, W*C]
        layer_in, kernels = seq, []
        for layer in range(2):
            name = f"cudnn_lstm/rnn/multi_rnn_cell/cell_{layer}/cudnn_compatible_lstm_cell"
            fan_in = int(layer_in.shape[-1])
            with tf.compat.v1.variable_scope(name):
                k = tf.compat.v1.get_variable("kernel", initializer=(rng.standard_normal((fan_in + U, 4 * U)) * 0.4)
                                              .astype(np.float32))
                b = tf.compat.v1.get_variable("bias", initializer=(rng.standard_normal(4 * U) * 0.3)
                                              .astype(np.float32))
            kernels.append((k, b))
            # CudnnCompatibleLSTMCell is LSTMBlockCell(forget_bias=0): gates i, c, f, o; the fused op runs it
            zeros = tf.zeros([B, U])
            res = tf.raw_ops.BlockLSTM(seq_len_max=tf.constant(H, tf.int64), x=layer_in, cs_prev=zeros,
                                       h_prev=zeros, w=k, wci=tf.zeros([U]), wcf=tf.zeros([U]), wco=tf.zeros([U]),
                                       b=b, forget_bias=0.0, cell_clip=-1.0, use_peephole=False)
            layer_in = res.h
            out[f"h_n_{layer}"], out[f"c_n_{layer}"] = res.h[-1], res.cs[-1]
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            d = os.path.join(OUT, "tf1_model")
            os.makedirs(d, exist_ok=True)
            saver.save(s, os.path.join(d, "model.ckpt"), write_meta_graph=False)
            res = s.run({"bn": y, "outputs": layer_in, "train_y": yt, "moving_mean": new_mean,
                         "moving_variance": new_var, **{k: v for k, v in out.items() if k != "x"}})
    out.update(res)
    np.savez(os.path.join(OUT, "tf1_model.npz"), **out)


def keras_model():
    import keras
    import tf_keras

    rng = np.random.default_rng(52)
    B, H, W, C = 2, 6, 5, 3

    def build(k):
        L = k.layers
        inp = L.Input((H, W, C))
        y = L.Conv2D(4, 3, padding="same", name="conv")(inp)
        y = L.BatchNormalization(name="bn")(y)
        y = L.Reshape((H, W * 4), name="rows")(y)
        y = L.Bidirectional(L.LSTM(5, return_sequences=True), name="bilstm")(y)
        y = L.GRU(4, return_sequences=True, reset_after=True, name="gru_after")(y)
        y = L.GRU(3, reset_after=False, name="gru_before")(y)
        return k.Model(inp, y)

    m3 = build(keras)
    weights = [rng.standard_normal(w.shape).astype(np.float32) * 0.5 for w in m3.get_weights()]
    bn = m3.get_layer("bn")
    n_before = sum(len(layer.get_weights()) for layer in m3.layers[:m3.layers.index(bn)])
    weights[n_before + 3] = rng.uniform(0.5, 2.0, weights[n_before + 3].shape).astype(np.float32)  # variance > 0
    m3.set_weights(weights)
    m2 = build(tf_keras)
    m2.set_weights(weights)
    x = rng.standard_normal((B, H, W, C)).astype(np.float32)
    y3 = m3(x, training=False).numpy()
    y2 = m2(x, training=False).numpy()
    np.testing.assert_allclose(y2, y3, rtol=1e-5, atol=1e-6)
    out = {"x": x, "y": y3}
    for layer in m3.layers:
        for i, w in enumerate(layer.get_weights()):
            out[f"weights/{layer.name}/{i}"] = w
    m3.save(os.path.join(OUT, "keras_model.keras"))
    m2.save(os.path.join(OUT, "keras_model.h5"))
    m2.save_weights(os.path.join(OUT, "keras_weights.h5"))
    # one training step of the BatchNormalization layer: Keras' moving statistics (momentum 0.99, biased var)
    conv_out = m3.get_layer("conv")(x)
    out["bn_input"] = conv_out.numpy()
    out["bn_train_y"] = bn(conv_out, training=True).numpy()
    out["bn_moving_mean"] = bn.moving_mean.numpy()
    out["bn_moving_variance"] = bn.moving_variance.numpy()
    np.savez(os.path.join(OUT, "keras_model.npz"), **out)


def keras_nested():
    """A Bidirectional layer and a nested Sequential model, in every Keras file layout."""
    import keras
    import tf_keras

    def build(k):
        L = k.layers
        inp = L.Input((6, 4))
        inner = k.Sequential([L.Dense(3, name="inner_dense"), L.Dense(2, name="inner_dense2")], name="inner")
        return k.Model(inp, inner(L.Bidirectional(L.LSTM(3, return_sequences=True), name="bi")(inp)))

    m3, m2 = build(keras), build(tf_keras)
    m2.set_weights(m3.get_weights())
    m3.save(os.path.join(OUT, "keras3_nested.keras"))
    m3.save(os.path.join(OUT, "keras3_nested.h5"))
    m3.save_weights(os.path.join(OUT, "keras3_nested.weights.h5"))
    m2.save(os.path.join(OUT, "tfkeras_nested.h5"))
    np.savez(os.path.join(OUT, "keras_nested.npz"), *m3.get_weights())


if __name__ == "__main__":
    values = {}
    checkpoints(values)
    saved_model(values)
    np.savez(os.path.join(OUT, "tf_checkpoint_values.npz"), **values)
    tf1_model()
    keras_model()
    keras_nested()
    for root, _, files in os.walk(OUT):
        for f in sorted(files):
            p = os.path.join(root, f)
            if "tf" in p or "keras" in p:
                print(f"{os.path.getsize(p):8d}  {os.path.relpath(p, OUT)}")
