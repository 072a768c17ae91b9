"""The steps of a fused program (`runtime.fusion`): its layers, loss, metrics and optimizer
over K models' stacked variables, each as Keras 3.15 (pinned in pyproject.toml) computes it
for one model.  Each function takes the program: its size K, its template model, and `of`,
a template variable's stacked variable."""

from __future__ import annotations

from typing import Any

from madlib_mop.runtime.fusion import ONE_MINUS, PER_MODEL_ARGUMENTS

_LOSS_FUNCTIONS = {"mse": "mean_squared_error", "mae": "mean_absolute_error"}


def forward(program, x, training: bool):
    import tensorflow as tf

    for layer in program.template.layers:
        x = layer_output(program, layer, x, training, tf)
    return x


def layer_output(program, layer, x, training, tf):
    name = type(layer).__name__
    if name == "InputLayer":
        return x
    if name == "Dense":
        if len(x.shape) == 3:  # (K, rows, features): one batched product
            y = tf.matmul(x, program.of(layer.kernel))
        else:
            shape = tf.shape(x)
            y = tf.matmul(tf.reshape(x, [program.size, -1, shape[-1]]), program.of(layer.kernel))
            y = tf.reshape(y, tf.concat([shape[:-1], [layer.units]], 0))
        if layer.use_bias:
            y = y + spread(program.of(layer.bias), len(x.shape), tf)
        return layer.activation(y)
    if name == "Conv2D":
        return conv2d(program, layer, x, tf)
    if name in ("Activation", "ReLU", "Softmax"):
        return layer(x) if name != "Activation" else layer.activation(x)
    if name == "Dropout":
        return dropout(program, layer, x, training, tf)
    if name == "Flatten":
        return tf.reshape(x, [program.size, tf.shape(x)[1], -1])
    if name == "Reshape":
        return tf.reshape(x, [program.size, tf.shape(x)[1], *layer.target_shape])
    if name == "BatchNormalization":
        return batch_normalization(program, layer, x, training, tf)
    if name in ("MaxPooling2D", "AveragePooling2D"):
        shape = tf.shape(x)
        merged = tf.reshape(x, tf.concat([[-1], shape[2:]], 0))
        pool = tf.nn.max_pool2d if name == "MaxPooling2D" else tf.nn.avg_pool2d
        y = pool(merged, ksize=layer.pool_size, strides=layer.strides,
                 padding=layer.padding.upper())
        return tf.reshape(y, tf.concat([shape[:2], tf.shape(y)[1:]], 0))
    if name == "GlobalAveragePooling2D":
        return tf.reduce_mean(x, axis=[2, 3], keepdims=bool(layer.keepdims))
    if name == "GlobalMaxPooling2D":
        return tf.reduce_max(x, axis=[2, 3], keepdims=bool(layer.keepdims))
    raise ValueError(f"layer {name} does not fuse")


def spread(vector, rank: int, tf):
    """Each model's vector (K, channels) shaped to broadcast over a tensor of `rank` (K, rows,
    ..., channels).  A reshape, whose gradient is one (an indexing with new axes has a
    strided slice's, several operations a step)."""
    shape = vector.shape
    return tf.reshape(vector, [shape[0]] + [1] * (rank - 2) + [shape[-1]])


def conv2d(program, layer, x, tf):
    """Each model's convolution of its own rows.  (One grouped convolution of the K
    models' channels side by side runs forward, but TensorFlow's CPU kernels have no
    gradient of a grouped convolution; a convolution's cost is its arithmetic anyway,
    which fusing does not lessen.)"""
    kernel = program.of(layer.kernel)  # (K, h, w, C, F)
    y = tf.stack([tf.nn.conv2d(x[k], kernel[k], strides=layer.strides,
                               padding=layer.padding.upper(), dilations=layer.dilation_rate)
                  for k in range(program.size)])
    if layer.use_bias:
        y = y + spread(program.of(layer.bias), 5, tf)
    return layer.activation(y)


def dropout(program, layer, x, training, tf):
    """Each model's mask from its own seed generator's state, as Keras draws it."""
    if not training or layer.rate == 0:
        return x
    seeds = program.of(layer.seed_generator.state)  # (K, 2)
    drawn = seeds.value()
    seeds.assign_add(tf.tile(tf.constant([[0, 1]], dtype=drawn.dtype), [program.size, 1]))
    masked = []
    for k in range(program.size):
        seed = drawn[k]
        if seed.dtype != tf.int32:
            seed = tf.cast(tf.math.floormod(seed, tf.int32.max - 1), tf.int32)
        masked.append(tf.nn.experimental.stateless_dropout(x[k], rate=layer.rate, seed=seed))
    return tf.stack(masked)


def batch_normalization(program, layer, x, training, tf):
    rank = len(x.shape)
    axes = list(range(1, rank - 1))  # all but the models' axis and the channels
    moving_mean, moving_variance = program.of(layer.moving_mean), program.of(layer.moving_variance)
    if training:
        mean, variance = tf.nn.moments(x, axes, keepdims=True)
        momentum = layer.momentum
        moving_mean.assign(moving_mean * momentum + tf.reshape(mean, tf.shape(moving_mean)) * (1.0 - momentum))
        moving_variance.assign(moving_variance * momentum
                               + tf.reshape(variance, tf.shape(moving_variance)) * (1.0 - momentum))
    else:
        mean, variance = spread(moving_mean, rank, tf), spread(moving_variance, rank, tf)
    gamma = spread(program.of(layer.gamma), rank, tf) if layer.scale else None
    beta = spread(program.of(layer.beta), rank, tf) if layer.center else None
    return tf.nn.batch_normalization(x, mean, variance, beta, gamma, layer.epsilon)

# ---- loss, metrics, optimizer ----

def losses(program, y, predicted, tf):
    """Each model's loss over its minibatch (K,), as compile's sum over batch size."""
    import keras

    values = getattr(keras.losses, _LOSS_FUNCTIONS.get(program.loss, program.loss))(y, predicted)
    values = tf.reshape(values, [program.size, -1])
    return tf.reduce_sum(values, axis=1) / tf.cast(tf.shape(values)[1], values.dtype)


def metric_sums(program, y, predicted, tf):
    """Each metric's sum over the minibatch's rows, per model: (K, metrics)."""
    sums = []
    sparse = y.shape.rank < predicted.shape.rank
    for metric in program.metrics:
        if metric in ("accuracy", "acc"):
            # Keras' rule (compile_utils.is_binary_or_sparse_categorical): shapes alone.
            metric = ("binary_accuracy" if predicted.shape[-1] == 1
                      else "sparse_categorical_accuracy" if sparse or y.shape[-1] == 1
                      else "categorical_accuracy")
        if metric == "categorical_accuracy":
            values = tf.cast(tf.equal(tf.argmax(y, -1), tf.argmax(predicted, -1)), tf.float32)
        elif metric == "sparse_categorical_accuracy":
            labels = y if sparse else y[..., 0]
            values = tf.cast(tf.equal(tf.cast(labels, tf.int64), tf.argmax(predicted, -1)), tf.float32)
        elif metric == "binary_accuracy":
            values = tf.reduce_mean(tf.cast(tf.equal(tf.cast(y, tf.float32),
                                                     tf.cast(predicted > 0.5, tf.float32)), tf.float32), -1)
        elif metric in ("mean_squared_error", "mse"):
            values = tf.reduce_mean(tf.square(predicted - tf.cast(y, predicted.dtype)), -1)
        else:
            values = tf.reduce_mean(tf.abs(predicted - tf.cast(y, predicted.dtype)), -1)
        # One value per row (Keras' mean over a row's other axes, where it has any), summed
        # over the rows.
        rows = values if values.shape.rank == 2 else \
            tf.reduce_mean(tf.reshape(values, [program.size, tf.shape(values)[1], -1]), axis=2)
        sums.append(tf.reduce_sum(rows, axis=1))
    return tf.stack(sums, axis=1) if sums else tf.zeros([program.size, 0])


def apply_update(program, gradients, arguments, tf):
    """The optimizer's update of every model at once, as Keras 3's update_step writes
    it; per-model arguments are vectors (K,) broadcast over each variable."""
    optimizer = program.template.optimizer
    iterations = program.of(optimizer.iterations)
    vectors = {"lr": program.of(optimizer._learning_rate).value()}
    for column, name in enumerate(PER_MODEL_ARGUMENTS[program.optimizer_name]
                                  + tuple("1-" + n for n in ONE_MINUS[program.optimizer_name])):
        vectors[name] = arguments[:, column]
    if program.optimizer_name == "Adam":
        # The same for every variable: computed once per step (Keras, per variable).
        step = tf.cast(iterations.value() + 1, tf.float32)
        vectors["alpha"] = vectors["lr"] * tf.sqrt(1 - tf.pow(vectors["beta_2"], step)) \
            / (1 - tf.pow(vectors["beta_1"], step))
    shaped: dict[tuple[str, int], Any] = {}

    def per_model(name: str, rank: int):
        """The vector as (K, 1, ...) for a variable of this rank, reshaped once a step."""
        if (name, rank) not in shaped:
            shaped[name, rank] = tf.reshape(vectors[name], [program.size] + [1] * (rank - 1))
        return shaped[name, rank]

    for index, (gradient, variable) in enumerate(zip(gradients, program.trainable)):
        rank = len(variable.shape)
        lr = per_model("lr", rank)
        if program.optimizer_name == "SGD":
            slot = slot_of(program, optimizer, "momentums", index)
            if slot is None:
                variable.assign_sub(gradient * lr)
                continue
            momentum = per_model("momentum", rank)
            slot.assign(slot * momentum - gradient * lr)
            if program.shared["nesterov"]:
                variable.assign_add(slot * momentum - gradient * lr)
            else:
                variable.assign_add(slot)
        elif program.optimizer_name == "Adam":
            m = program.of(optimizer._momentums[index])
            v = program.of(optimizer._velocities[index])
            m.assign_add((gradient - m) * per_model("1-beta_1", rank))
            v.assign_add((tf.square(gradient) - v) * per_model("1-beta_2", rank))
            if program.shared["amsgrad"]:
                v_hat = program.of(optimizer._velocity_hats[index])
                v_hat.assign(tf.maximum(v_hat, v))
                v = v_hat
            variable.assign_sub((m * per_model("alpha", rank))
                                / (tf.sqrt(v) + per_model("epsilon", rank)))
        else:  # RMSprop
            rho, epsilon = per_model("rho", rank), per_model("epsilon", rank)
            velocity = program.of(optimizer._velocities[index])
            velocity.assign(rho * velocity + per_model("1-rho", rank) * tf.square(gradient))
            if program.shared["centered"]:
                average = program.of(optimizer._average_gradients[index])
                average.assign(rho * average + per_model("1-rho", rank) * gradient)
                denominator = velocity - tf.square(average) + epsilon
            else:
                denominator = velocity + epsilon
            increment = lr * gradient / tf.sqrt(denominator)
            slot = slot_of(program, optimizer, "_momentums", index)
            if slot is not None:
                slot.assign(per_model("momentum", rank) * slot + increment)
                variable.assign_sub(slot)
            else:
                variable.assign_sub(increment)
    iterations.assign_add(tf.ones_like(iterations))


def slot_of(program, optimizer, name: str, index: int):
    slots = getattr(optimizer, name, None) or []
    return program.of(slots[index]) if index < len(slots) and slots[index] is not None else None
