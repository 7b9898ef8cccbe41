"""Generator (run with the TensorFlow venv): random cases of FusedBatchNormV3 / FusedBatchNormGradV3.

Each case holds the attributes, the inputs, TF's forward outputs and, where TF supports it (not inference with
a channels-first format), TF's gradient-op outputs fed with TF's own reserve spaces. Second-order cases hold the
gradients of a random linear loss of GradV3's outputs w.r.t. (y_backprop, x, scale). check_fused_batch_norm.py
replays them through torchops. Usage: gen_fused_batch_norm.py OUTDIR [--cases N] [--seed S]
"""
import argparse
import os

import numpy as np
import tensorflow as tf

FORMATS = {"NHWC": 4, "NCHW": 4, "NDHWC": 5, "NCDHW": 5}
DTYPES = {"float32": tf.float32, "float16": tf.float16, "bfloat16": tf.bfloat16}


def random_shape(rng, rank):
    dims = [int(rng.choice([1, 1, 2, 3, 5, 8, 13])) for _ in range(rank)]
    if rng.random() < 0.2:  # a long channel run
        dims[int(rng.integers(1, rank))] = int(rng.choice([64, 200]))
    return dims


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--cases", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    n = 0
    for case in range(args.cases):
        fmt = str(rng.choice(list(FORMATS)))
        shape = random_shape(rng, FORMATS[fmt])
        c = shape[-1] if fmt.endswith("C") else shape[1]
        training = bool(rng.random() < 0.6)
        eaf = float(rng.choice([1.0, 0.6, 0.1]))
        eps = float(rng.choice([1e-3, 1e-5, 1e-7]))
        dt = str(rng.choice(list(DTYPES)))
        x = (rng.standard_normal(shape) * rng.choice([0.1, 1.0, 30.0]) + rng.choice([0.0, 5.0])).astype(np.float32)
        scale = (rng.random(c) + 0.5).astype(np.float32)
        offset = rng.standard_normal(c).astype(np.float32)
        mean = rng.standard_normal(c).astype(np.float32)
        var = (rng.random(c) + 0.5).astype(np.float32)
        dy = rng.standard_normal(shape).astype(np.float32)
        use_stats = not training or eaf != 1.0
        m_in = mean if use_stats else np.zeros([0], np.float32)
        v_in = var if use_stats else np.zeros([0], np.float32)
        xt = tf.cast(tf.constant(x), DTYPES[dt])
        out = tf.raw_ops.FusedBatchNormV3(x=xt, scale=scale, offset=offset, mean=m_in, variance=v_in, epsilon=eps,
                                          exponential_avg_factor=eaf, data_format=fmt, is_training=training)
        rec = dict(fmt=fmt, training=training, eaf=eaf, eps=eps, dtype=dt, x=x, scale=scale, offset=offset,
                   mean=m_in, variance=v_in, dy=dy, y=tf.cast(out[0], tf.float32).numpy(), batch_mean=out[1].numpy(),
                   batch_variance=out[2].numpy())
        if training:
            rec.update(reserve_space_1=out[3].numpy(), reserve_space_2=out[4].numpy())
        rs1 = out[3] if training else tf.constant(mean)
        rs2 = out[4] if training else tf.constant(var)
        if training or fmt.endswith("C"):
            dyt, xv, sv = tf.Variable(tf.cast(dy, DTYPES[dt])), tf.Variable(xt), tf.Variable(scale)
            gx, gs, go = (rng.standard_normal(shape).astype(np.float32), rng.standard_normal(c).astype(np.float32),
                          rng.standard_normal(c).astype(np.float32))
            with tf.GradientTape() as tape:
                g = tf.raw_ops.FusedBatchNormGradV3(y_backprop=dyt, x=xv, scale=sv, reserve_space_1=rs1,
                                                    reserve_space_2=rs2, reserve_space_3=out[5], epsilon=eps,
                                                    data_format=fmt, is_training=training)
                loss = (tf.reduce_sum(tf.cast(g[0], tf.float32) * gx) + tf.reduce_sum(g[1] * gs)
                        + tf.reduce_sum(g[2] * go))
            d_dy, d_x, d_scale = tape.gradient(loss, [dyt, xv, sv])
            rec.update(x_backprop=tf.cast(g[0], tf.float32).numpy(), scale_backprop=g[1].numpy(),
                       offset_backprop=g[2].numpy(), rs1=rs1.numpy(), rs2=rs2.numpy(), gx=gx, gs=gs, go=go)
            if dt == "float32" and training:  # TF's second order runs in float32; compare it there
                rec.update(d_dy=d_dy.numpy(), d_x=d_x.numpy(), d_scale=d_scale.numpy())
        np.savez(os.path.join(args.outdir, f"fbn_{case:04d}.npz"), **rec)
        n += 1
    print(f"{n} FusedBatchNormV3 cases written")


if __name__ == "__main__":
    main()
