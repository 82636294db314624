"""fusekit.tensorflow.LazyAdam: a Keras 3 optimizer (TensorFlow backend) on fusekit's LazyAdam."""

from __future__ import annotations

import keras
import tensorflow as tf

from . import resource_sparse_apply_lazy_adam


def lazy_adam_step_size(learning_rate, iterations, beta_1, beta_2):
    """The bias-corrected step of Keras' Adam, ``lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)`` with
    ``t = iterations + 1``, in float32 (computed as keras.optimizers.Adam computes it)."""
    lr = tf.cast(learning_rate, tf.float32)
    t = tf.cast(iterations + 1, tf.float32)
    beta_1_power = tf.pow(tf.cast(beta_1, tf.float32), t)
    beta_2_power = tf.pow(tf.cast(beta_2, tf.float32), t)
    return lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)


def sparse_rows(gradient: tf.IndexedSlices, variable):
    """(values [N, dim], indices [N]) of an IndexedSlices gradient of a 2-D float32 variable, or
    None where fusekit's op does not apply (another rank or dtype: the caller's dense path)."""
    if variable.shape.rank != 2 or variable.dtype != tf.float32:
        return None
    return tf.cast(gradient.values, tf.float32), gradient.indices


def adam_arguments(who, beta_1, beta_2, epsilon, kwargs):
    """Adam's beta_1, beta_2, epsilon as floats (the op takes them as attributes) and the other
    arguments less ``amsgrad``, which a lazy update does not have; refusals name ``who``."""
    if kwargs.pop("amsgrad", False):
        raise ValueError(f"{who}: amsgrad is not supported")
    for key, value in (("beta_1", beta_1), ("beta_2", beta_2), ("epsilon", epsilon)):
        if not isinstance(value, (int, float)):
            raise TypeError(f"{who}: {key} must be a float, got {type(value).__name__}")
    return dict(beta_1=float(beta_1), beta_2=float(beta_2), epsilon=float(epsilon),
                amsgrad=False, **kwargs)


@keras.saving.register_keras_serializable(package="fusekit")
class LazyAdam(keras.optimizers.Adam):
    """Adam that updates only the rows an ``IndexedSlices`` gradient names (an embedding table's
    rows in the batch): their m, v and weights, with fusekit's LazyAdam op; every other row's m,
    v and weights stay bit for bit as they were. Duplicate indices are summed; the bias
    correction is Keras Adam's. On dense gradients (and on sparse ones of variables that are not
    2-D float32) it is ``keras.optimizers.Adam``, step for step.

    The arguments are ``keras.optimizers.Adam``'s (``learning_rate`` may be a schedule),
    except ``amsgrad`` and ``weight_decay``, which a lazy update does not have (decay would touch
    every row each step). ``beta_1``, ``beta_2`` and ``epsilon`` are floats.

    The table is updated in place under its lock and is not switched to copy-on-read mode: the
    forward pass of ``keras.layers.Embedding`` reads the whole table every step, which would copy
    it in that mode. Runs under ``tf.function`` (``model.fit``); not under XLA
    (``jit_compile=True``): XLA has no kernel for a custom op (Keras' ``"auto"`` turns XLA off on
    a CPU-only machine).
    """

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                 name="lazy_adam", **kwargs):
        if kwargs.get("weight_decay") is not None:
            raise ValueError("fusekit.tensorflow.LazyAdam: weight_decay is not supported (a lazy "
                             "update touches only the batch's rows; decay would touch them all)")
        super().__init__(learning_rate=learning_rate, name=name, **adam_arguments(
            "fusekit.tensorflow.LazyAdam", beta_1, beta_2, epsilon, kwargs))

    def update_step(self, gradient, variable, learning_rate):
        rows = sparse_rows(gradient, variable) if isinstance(gradient, tf.IndexedSlices) else None
        if rows is None:
            return super().update_step(gradient, variable, learning_rate)
        index = self._get_variable_index(variable)
        resource_sparse_apply_lazy_adam(
            variable, self._momentums[index], self._velocities[index],
            lazy_adam_step_size(learning_rate, self.iterations, self.beta_1, self.beta_2),
            *rows, beta1=self.beta_1, beta2=self.beta_2, epsilon=self.epsilon,
            copy_on_read=False)

    def get_config(self):
        config = super().get_config()
        config.pop("amsgrad", None)
        return config
