"""fusekit.tensorflow against TensorFlow 2.21, Keras 3.15 and tf-keras 2.21
(requirements/tensorflow.txt). The lane in .ci/integration builds the wheel in that environment
(pip wheel --no-build-isolation: the op library comes with it when TensorFlow is importable) and
runs this file against the installed copy; locally, PYTHONPATH=<a CMake build with
-DFUSEKIT_TENSORFLOW=ON>/python.

- mx_rec's call pattern, tf.compat.v1 graph mode on TF1 ref variables, against an independent NumPy
  float32 reference (docs/lazy_adam.md's order of operations), bit for bit; in place; fusekit's
  kernel winning over a stand-in for mx_rec's stub kernel in either load order.
- FusekitResourceSparseApplyLazyAdam in eager mode and under tf.function, both locking modes,
  int32 and int64 indices; a read taken before the update keeps its values.
- Keras 3: fusekit.tensorflow.LazyAdam leaves the rows outside the batch bit for bit as they were
  (keras.optimizers.Adam shown not to), its sparse step equals the reference, its dense step
  equals keras.optimizers.Adam's, model.fit, schedules, get_config, .keras save and load.
- tf_keras: fusekit.tensorflow.legacy.LazyAdam the same way.
- Refusals: out-of-range index (InvalidArgumentError naming it, nothing modified), wrong dtypes
  and shapes; the package without its op library.
- 8-bit state: FusekitResourceSparseApplyLazyAdamQuant and LazyAdam8bit against
  golden/lazy_adam_quant.py (the dynamic maps, with and without the lost-v guard) and
  golden/fp8_state.py (state_format="fp8"), NumPy, bit for bit; the example at a tiny size.

Random inputs from recorded seeds (SEED), with duplicate and negative indices; no timing.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
ft = pytest.importorskip("fusekit.tensorflow")
import fusekit  # noqa: E402  (the core package, which fusekit.tensorflow comes with)

SEED = 20261202
B1, B2, EPS = 0.9, 0.999, 1e-7


# ---------------------------------------------------------------------------------------------
# The reference: docs/lazy_adam.md, in NumPy float32, written here independently of the library.
# ---------------------------------------------------------------------------------------------
def reference_step(m, v, var, grad, indices, lr, beta1=B1, beta2=B2, epsilon=EPS):
    """One LazyAdam step on copies of m, v, var: per distinct row r >= 0, g = the sum of its
    gradient rows left to right; m = m*b1 + g*(1-b1); v = |v*b2 + (g*g)*(1-b2)|;
    var = var + (m*-lr)/(sqrt(v)+eps); all float32."""
    f = np.float32
    m, v, var = m.copy(), v.copy(), var.copy()
    b1, b2, eps, lr = f(beta1), f(beta2), f(epsilon), f(lr)
    sums = {}
    for position, r in enumerate(np.asarray(indices).reshape(-1)):
        if r < 0:
            continue
        g = grad[position].astype(np.float32)
        sums[int(r)] = g.copy() if int(r) not in sums else (sums[int(r)] + g).astype(np.float32)
    for r, g in sums.items():
        m[r] = m[r] * b1 + g * (f(1) - b1)
        v[r] = np.abs(v[r] * b2 + (g * g) * (f(1) - b2))
        var[r] = var[r] + (m[r] * -lr) / (np.sqrt(v[r]) + eps)
    return m, v, var


def random_case(rng, rows, dim, n):
    """Tables with m, v >= 0 where they should be, and indices with duplicates and padding."""
    m = rng.standard_normal((rows, dim)).astype(np.float32) * np.float32(0.1)
    v = np.abs(rng.standard_normal((rows, dim))).astype(np.float32) * np.float32(0.01)
    var = rng.standard_normal((rows, dim)).astype(np.float32)
    grad = rng.standard_normal((n, dim)).astype(np.float32)
    indices = rng.integers(-3, rows, n).astype(np.int32)  # duplicates (n ~ rows) and negatives
    if n >= 4:
        indices[1] = indices[3] = max(indices[0], 0)  # a row named three times at least
        indices[2] = -1
    return m, v, var, grad, indices


def assert_bitwise(got, want, what):
    got = np.asarray(got)
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if got.dtype != np.float32:
        assert np.array_equal(got, want), f"{what}: {got!r} != {want!r}"
        return
    diff = np.flatnonzero(got.reshape(-1).view(np.uint32) != want.reshape(-1).view(np.uint32))
    assert diff.size == 0, f"{what}: {diff.size} elements differ, first at {diff[0]}: " \
                           f"{got.reshape(-1)[diff[0]]!r} != {want.reshape(-1)[diff[0]]!r}"


# ---------------------------------------------------------------------------------------------
# mx_rec's op, as mx_rec calls it: graph mode, TF1 ref variables.
# ---------------------------------------------------------------------------------------------
def mx_rec_graph(m0, v0, var0, beta1=B1, beta2=B2, epsilon=EPS, lazy_adam=None):
    """mx_rec's create_hash_optimizer(use_fusion_optim=True) pattern: ref variables, lr_t with the
    bias correction folded in, lazy_adam(grad, tf.expand_dims(indices, 1), m, v, var, lr_t, ...)."""
    lazy_adam = lazy_adam or ft.load().lazy_adam
    graph = tf.Graph()
    with graph.as_default():
        m = tf.compat.v1.Variable(m0, use_resource=False, name="m")
        v = tf.compat.v1.Variable(v0, use_resource=False, name="v")
        var = tf.compat.v1.Variable(var0, use_resource=False, name="var")
        grad = tf.compat.v1.placeholder(tf.float32, [None, var0.shape[1]])
        indices = tf.compat.v1.placeholder(tf.int32, [None])
        step = tf.compat.v1.placeholder(tf.float32, [])
        lr = tf.constant(0.01, tf.float32)
        lr_t = lr * tf.sqrt(1 - tf.pow(beta2, step)) / (1 - tf.pow(beta1, step))
        update = lazy_adam(grad, tf.expand_dims(indices, 1), m, v, var, lr_t, beta1=beta1,
                           beta2=beta2, epsilon=epsilon)
        init = tf.compat.v1.global_variables_initializer()
    session = tf.compat.v1.Session(graph=graph)
    session.run(init)
    return session, dict(m=m, v=v, var=var, grad=grad, indices=indices, step=step, lr_t=lr_t,
                         update=update)


@pytest.mark.parametrize("dim", [7, 16, 37])  # below, at and above 16 float32 lanes
def test_mx_rec_pattern_graph_mode_ref_variables_bitwise(dim):
    rng = np.random.default_rng(SEED + dim)
    rows, n = 40, 48
    m, v, var, _, _ = random_case(rng, rows, dim, n)
    session, g = mx_rec_graph(m, v, var)
    with session:
        for step in range(1, 4):
            _, _, _, grad, indices = random_case(rng, rows, dim, n)
            outputs, lr_t = session.run([g["update"], g["lr_t"]], {
                g["grad"]: grad, g["indices"]: indices, g["step"]: step})
            m, v, var = reference_step(m, v, var, grad, indices, lr_t)
            # In place: the variables hold the update, and the outputs are the same values.
            tables = session.run([g["m"], g["v"], g["var"]])
            for name, got, out, want in zip("m v var".split(), tables, outputs, (m, v, var)):
                assert_bitwise(got, want, f"step {step} {name}")
                assert_bitwise(out, want, f"step {step} output {name}")


def test_mx_rec_pattern_empty_batch_and_out_of_range():
    rng = np.random.default_rng(SEED)
    m, v, var, grad, indices = random_case(rng, 20, 5, 9)
    session, g = mx_rec_graph(m, v, var)
    tables = [g["m"], g["v"], g["var"]]
    with session:
        session.run(g["update"], {g["grad"]: np.zeros((0, 5), np.float32),
                                  g["indices"]: np.zeros((0,), np.int32), g["step"]: 1})
        for got, want in zip(session.run(tables), (m, v, var)):
            assert_bitwise(got, want, "N = 0 changes nothing")
        indices[5] = 20
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[5\] = 20 .*20 rows"):
            session.run(g["update"], {g["grad"]: grad, g["indices"]: indices, g["step"]: 1})
        for got, want in zip(session.run(tables), (m, v, var)):
            assert_bitwise(got, want, "a refused step modifies nothing")


@pytest.fixture(scope="module")
def stub_library(tmp_path_factory):
    """The stand-in for mx_rec's library: the CMake build's (<build>/tests/tensorflow), or, for an
    installed fusekit (the lane's wheel), compiled here with TensorFlow's own flags."""
    built = pathlib.Path(ft.op_library_path()).parents[3] / "tests/tensorflow/_mx_rec_stub_ops.so"
    if built.exists():
        return built
    source = pathlib.Path(__file__).with_name("tensorflow_mx_rec_stub.cc")
    out = tmp_path_factory.mktemp("stub") / "_mx_rec_stub_ops.so"
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the stand-in for mx_rec's op library")
    command = [cxx, "-shared", "-fPIC", "-O1", str(source), "-o", str(out),
               *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, " ".join(command) + "\n" + run.stderr[-3000:]
    return out


_KERNEL_CHECK = """
import sys, numpy as np, tensorflow as tf
import fusekit.tensorflow as ft
first, second = sys.argv[1:3]
libs = {"fusekit": ft.op_library_path(), "stub": sys.argv[3]}
modules = {name: tf.load_op_library(libs[name]) for name in (first, second)}
op = getattr(modules[first], "lazy_adam", None) or modules[second].lazy_adam
var = np.ones((4, 3), np.float32)
out = op(np.ones((1, 3), np.float32), np.array([[2]], np.int32), np.zeros((4, 3), np.float32),
         np.zeros((4, 3), np.float32), var, np.float32(0.5), beta1=0.9, beta2=0.999, epsilon=1e-7)
changed = np.flatnonzero((out[2].numpy() != 1).any(axis=1)).tolist()
print("rows changed", changed)
if first == "stub":  # fusekit's wrapper says where the op's wrapper is
    try:
        ft.lazy_adam(*([None] * 6), beta1=0.9, beta2=0.999, epsilon=1e-7)
        sys.exit(2)
    except RuntimeError as e:
        assert "registered by another library" in str(e), e
sys.exit(0 if changed == [2] else 1)
"""


@pytest.mark.parametrize("order", [("stub", "fusekit"), ("fusekit", "stub")])
def test_fusekit_kernel_wins_over_mx_rec_stub(order, stub_library):
    """Both libraries register LazyAdam's CPU kernel; fusekit's priority picks its kernel."""
    run = subprocess.run([sys.executable, "-c", _KERNEL_CHECK, *order, str(stub_library)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]


def test_mx_rec_op_refusals_eager():
    lazy_adam = ft.load().lazy_adam
    table = np.zeros((6, 4), np.float32)
    kw = dict(beta1=B1, beta2=B2, epsilon=EPS)
    grad, idx = np.ones((2, 4), np.float32), np.array([[1], [2]], np.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="gradient must be"):
        lazy_adam(np.ones((2, 5), np.float32), idx, table, table.copy(), table.copy(), 0.1, **kw)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must have var's shape"):
        lazy_adam(grad, idx, np.zeros((6, 3), np.float32), table, table.copy(), 0.1, **kw)
    with pytest.raises(tf.errors.InvalidArgumentError, match="indices must be"):
        lazy_adam(grad, np.ones((2, 2), np.int32), table, table.copy(), table.copy(), 0.1, **kw)
    with pytest.raises(tf.errors.InvalidArgumentError, match="lr must be a scalar"):
        lazy_adam(grad, idx, table, table.copy(), table.copy(), [0.1, 0.2], **kw)
    with pytest.raises((TypeError, ValueError, tf.errors.InvalidArgumentError),
                       match="int32|int64|float|double"):
        lazy_adam(grad, tf.constant(idx, tf.int64), table, table.copy(), table.copy(), 0.1, **kw)
    with pytest.raises((TypeError, ValueError, tf.errors.InvalidArgumentError),
                       match="float|double"):
        lazy_adam(tf.constant(grad, tf.float64), idx, table, table.copy(), table.copy(), 0.1, **kw)
    with pytest.raises(tf.errors.InvalidArgumentError, match="beta1"):
        lazy_adam(grad, idx, table, table.copy(), table.copy(), 0.1, beta1=1.0, beta2=B2,
                  epsilon=EPS)


# ---------------------------------------------------------------------------------------------
# The resource-variable op.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("copy_on_read", [True, False])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_resource_op_bitwise(mode, copy_on_read, index_dtype):
    rng = np.random.default_rng(SEED + 7)
    rows, dim, n = 30, 17, 40
    m, v, var, _, _ = random_case(rng, rows, dim, n)
    tv, tm, tvv = tf.Variable(var), tf.Variable(m), tf.Variable(v)

    def step(lr, grad, indices):
        ft.resource_sparse_apply_lazy_adam(tv, tm, tvv, lr, grad, indices,
                                           use_locking=copy_on_read, copy_on_read=copy_on_read)
    if mode == "function":
        step = tf.function(step)
    for k in range(3):
        _, _, _, grad, indices = random_case(rng, rows, dim, n)
        lr = np.float32(0.01 * (k + 1))
        held = tv.value()  # a read taken before the step keeps its values
        step(tf.constant(lr), tf.constant(grad), tf.constant(indices.astype(index_dtype)))
        assert_bitwise(held.numpy(), var, f"step {k}: the earlier read")
        m, v, var = reference_step(m, v, var, grad, indices, lr)
        for name, got, want in (("var", tv, var), ("m", tm, m), ("v", tvv, v)):
            assert_bitwise(got.numpy(), want, f"step {k} {name}")


def test_resource_op_refusals():
    rng = np.random.default_rng(SEED + 11)
    m, v, var, grad, indices = random_case(rng, 12, 3, 10)
    tv, tm, tvv = tf.Variable(var), tf.Variable(m), tf.Variable(v)
    indices[7] = 12
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[7\] = 12 .*12 rows"):
        ft.resource_sparse_apply_lazy_adam(tv, tm, tvv, 0.1, grad, indices)
    for name, got, want in (("var", tv, var), ("m", tm, m), ("v", tvv, v)):
        assert_bitwise(got.numpy(), want, f"refused: {name} unchanged")
    indices[7] = -5  # padding: skipped
    with pytest.raises(tf.errors.InvalidArgumentError, match="gradient must be"):
        ft.resource_sparse_apply_lazy_adam(tv, tm, tvv, 0.1, grad[:, :2], indices)
    for copy_on_read in (True, False):  # refused before the locking helpers touch it
        wide = tf.Variable(var.astype(np.float64))
        held = wide.value()  # a live read: the helpers would copy the table
        with pytest.raises(tf.errors.InvalidArgumentError, match="var must be a float32 variable"):
            ft.resource_sparse_apply_lazy_adam(wide, tm, tvv, 0.1, grad, indices,
                                               copy_on_read=copy_on_read)
        del held
    with pytest.raises(tf.errors.InvalidArgumentError, match="must have var's shape"):
        ft.resource_sparse_apply_lazy_adam(tv, tf.Variable(m[:5]), tvv, 0.1, grad, indices)
    with pytest.raises((TypeError, tf.errors.InvalidArgumentError), match="int32|int64|float"):
        ft.resource_sparse_apply_lazy_adam(tv, tm, tvv, 0.1, grad, tf.constant(indices, tf.float32))
    ft.resource_sparse_apply_lazy_adam(tv, tm, tvv, 0.1, grad[:0], indices[:0])  # N = 0
    assert_bitwise(tv.numpy(), var, "N = 0 changes nothing")
    graph = tf.Graph()  # variables never initialized: refused, not crashed
    with graph.as_default():
        gv, gm, gvv = (tf.compat.v1.Variable(x, use_resource=True) for x in (var, m, v))
        update = ft.resource_sparse_apply_lazy_adam(gv, gm, gvv, 0.1, grad, indices)
        with tf.compat.v1.Session(graph=graph) as session:
            with pytest.raises((tf.errors.FailedPreconditionError, tf.errors.NotFoundError)):
                session.run(update)


# ---------------------------------------------------------------------------------------------
# Keras 3.
# ---------------------------------------------------------------------------------------------
def embedding_model(rows, dim, seed):
    keras.utils.set_random_seed(seed)
    ids = keras.Input((3,), dtype="int32")
    x = keras.layers.Embedding(rows, dim, name="table")(ids)
    x = keras.layers.Flatten()(x)
    out = keras.layers.Dense(1, name="head")(x)
    return keras.Model(ids, out)


def test_keras_sparse_step_bitwise_with_duplicates():
    rng = np.random.default_rng(SEED + 21)
    rows, dim, n = 25, 16, 30
    m, v, var, grad, indices = random_case(rng, rows, dim, n)
    indices = np.where(indices < 0, 0, indices)  # IndexedSlices from Keras have no padding
    opt = ft.LazyAdam(learning_rate=0.02)
    table = keras.Variable(var)
    opt.build([table])
    opt._momentums[0].assign(m)
    opt._velocities[0].assign(v)
    for k in range(2):
        lr_t = ft._keras.lazy_adam_step_size(opt.learning_rate, opt.iterations, B1, B2).numpy()
        opt.apply_gradients([(tf.IndexedSlices(tf.constant(grad), tf.constant(indices),
                                               tf.constant([rows, dim])), table)])
        m, v, var = reference_step(m, v, var, grad, indices, lr_t)
        assert_bitwise(table.numpy(), var, f"step {k} var")
        assert_bitwise(opt._momentums[0].numpy(), m, f"step {k} m")
        assert_bitwise(opt._velocities[0].numpy(), v, f"step {k} v")


def test_keras_lazy_rows_unchanged_and_stock_adam_not_lazy():
    """Step 1 touches rows A, step 2 rows B (disjoint): LazyAdam leaves A as step 1 left it; the
    stock keras.optimizers.Adam moves A again in step 2 (its m of A is not zero)."""
    rows, dim = 50, 8
    rng = np.random.default_rng(SEED + 31)
    batch_a = rng.permutation(25)[:12].reshape(4, 3).astype(np.int32)
    batch_b = (25 + rng.permutation(25)[:12]).reshape(4, 3).astype(np.int32)
    y = rng.standard_normal((4, 1)).astype(np.float32)
    results = {}
    for name, make in (("fusekit", ft.LazyAdam), ("keras", keras.optimizers.Adam)):
        model = embedding_model(rows, dim, SEED)
        model.compile(make(learning_rate=0.05), "mse")
        w0 = model.get_layer("table").embeddings.numpy()
        model.train_on_batch(batch_a, y)
        w1 = model.get_layer("table").embeddings.numpy()
        model.train_on_batch(batch_b, y)
        w2 = model.get_layer("table").embeddings.numpy()
        results[name] = (w0, w1, w2)
    a, b = np.unique(batch_a), np.unique(batch_b)
    rest = np.setdiff1d(np.arange(rows), np.union1d(a, b))
    w0, w1, w2 = results["fusekit"]
    assert (w1[a] != w0[a]).all(axis=1).all() and (w2[b] != w1[b]).all(axis=1).all()
    assert_bitwise(w2[a], w1[a], "LazyAdam: step 2 leaves step 1's rows")
    assert_bitwise(w2[rest], w0[rest], "LazyAdam: rows never in a batch")
    k0, k1, k2 = results["keras"]
    assert (k2[a] != k1[a]).any(axis=1).all(), "keras.optimizers.Adam was expected not to be lazy"


def test_keras_dense_path_equals_keras_adam():
    rng = np.random.default_rng(SEED + 41)
    w = rng.standard_normal((9, 5)).astype(np.float32)
    grads = [rng.standard_normal((9, 5)).astype(np.float32) for _ in range(4)]
    finals = []
    for make in (ft.LazyAdam, keras.optimizers.Adam):
        var = keras.Variable(w)
        opt = make(learning_rate=0.01, beta_1=0.8, beta_2=0.99, epsilon=1e-6)
        for g in grads:
            opt.apply_gradients([(tf.constant(g), var)])
        finals.append(var.numpy())
    assert_bitwise(finals[0], finals[1], "dense step")


def test_keras_config_schedule_and_refusals():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=2, decay_rate=0.5)
    opt = ft.LazyAdam(learning_rate=schedule, beta_1=0.85, epsilon=1e-6)
    config = keras.optimizers.serialize(opt)
    again = keras.optimizers.deserialize(config)
    assert type(again) is ft.LazyAdam
    assert again.beta_1 == 0.85 and again.epsilon == 1e-6
    assert isinstance(again.learning_rate, keras.optimizers.schedules.ExponentialDecay) or \
        isinstance(again._learning_rate, keras.optimizers.schedules.ExponentialDecay)
    # The schedule drives the sparse step: its learning rate at iterations = 0 is 0.01.
    table = keras.Variable(np.ones((4, 2), np.float32))
    again.apply_gradients([(tf.IndexedSlices(tf.ones((1, 2)), tf.constant([1]),
                                             tf.constant([4, 2])), table)])
    lr_t = ft._keras.lazy_adam_step_size(0.01, 0, 0.85, 0.999).numpy()
    _, _, want = reference_step(np.zeros((4, 2), np.float32), np.zeros((4, 2), np.float32),
                                np.ones((4, 2), np.float32), np.ones((1, 2), np.float32),
                                np.array([1]), lr_t, 0.85, 0.999, 1e-6)
    assert_bitwise(table.numpy(), want, "scheduled step")
    with pytest.raises(ValueError, match="amsgrad"):
        ft.LazyAdam(amsgrad=True)
    with pytest.raises(ValueError, match="weight_decay"):
        ft.LazyAdam(weight_decay=0.01)
    bad = keras.Variable(np.ones((4, 2), np.float32))
    opt = ft.LazyAdam()
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[1\] = 9"):
        opt.apply_gradients([(tf.IndexedSlices(tf.ones((2, 2)), tf.constant([0, 9]),
                                               tf.constant([4, 2])), bad)])
    assert_bitwise(bad.numpy(), np.ones((4, 2), np.float32), "refused: unchanged")
    # XLA has no kernel for the op (docs/tensorflow.md): jit_compile=True is refused clearly.
    model = embedding_model(10, 4, SEED)
    model.compile(ft.LazyAdam(), "mse", jit_compile=True)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="FusekitResourceSparseApplyLazyAdam.*XLA|XLA.*FusekitResource"):
        model.train_on_batch(np.array([[1, 2, 3]], np.int32), np.ones((1, 1), np.float32))


def test_keras_fit_save_load_resumes(tmp_path):
    rows, dim = 200, 8
    rng = np.random.default_rng(SEED + 51)
    x = rng.integers(0, rows, (256, 3)).astype(np.int32)
    y = (x.sum(axis=1, keepdims=True) % 7 / 7.0).astype(np.float32)
    model = embedding_model(rows, dim, SEED)
    model.compile(ft.LazyAdam(learning_rate=0.01), "mse")
    history = model.fit(x, y, batch_size=32, epochs=4, shuffle=False, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < losses[0], losses
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is ft.LazyAdam
    assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations) == 32
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        assert_bitwise(b.numpy(), a.numpy(), f"optimizer variable {a.path}")
    # A new process finds the optimizer once fusekit.tensorflow is imported.
    run = subprocess.run(
        [sys.executable, "-c", "import sys, keras, fusekit.tensorflow; "
         "o = keras.models.load_model(sys.argv[1]).optimizer; "
         "print(type(o).__module__, type(o).__name__, int(o.iterations))", str(path)],
        capture_output=True, text=True, timeout=300)
    assert run.stdout.split() == ["fusekit.tensorflow._keras", "LazyAdam", "32"], \
        run.stdout + run.stderr[-3000:]
    for m in (model, loaded):
        m.fit(x[:64], y[:64], batch_size=32, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.weights, loaded.weights):
        assert_bitwise(b.numpy(), a.numpy(), f"after resuming: {a.path}")


# ---------------------------------------------------------------------------------------------
# 8-bit state: FusekitResourceSparseApplyLazyAdamQuant and fusekit.tensorflow.LazyAdam8bit,
# against golden/lazy_adam_quant.py (NumPy, written from the spec, not from the C++).
# ---------------------------------------------------------------------------------------------
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # golden/
from golden import fp8_state  # noqa: E402
from golden.lazy_adam_quant import lazy_adam_quant_golden  # noqa: E402


def quant_golden(grad, indices, m, v, var, am, av, lr, beta1=B1, beta2=B2, epsilon=EPS,
                 guard_lost_v=False):
    """golden/lazy_adam_quant.py's step (the dynamic maps): new (m, v, var, absmax_m, absmax_v)."""
    return lazy_adam_quant_golden(grad, np.asarray(indices).reshape(-1), m, v, var, QM, QV, am, av,
                                  lr, beta1, beta2, epsilon, "float32", "float32",
                                  guard_lost_v=guard_lost_v)[:5]


def fp8_golden(grad, indices, m, v, var, sm, sv, lr, beta1=B1, beta2=B2, epsilon=EPS,
               guard_lost_v=True):
    """golden/fp8_state.py's step (the fp8 format, the lost-v guard on): new (m codes, v codes,
    var, scale_m, scale_v), in quant_golden's order. guard_lost_v=False only to show that a case
    needs the guard."""
    var, m, v, sm, sv, _ = fp8_state.lazy_adam_quant_fp8(
        var, grad, np.asarray(indices).reshape(-1), m, v, sm, sv, lr, beta1, beta2, epsilon,
        _guard_lost_v=guard_lost_v)
    return m, v, var, sm, sv


def state_golden(state_format, *args, **kwargs):
    """The golden of a format, the lost-v guard on (as LazyAdam8bit runs both)."""
    if state_format == "fp8":
        return fp8_golden(*args, **kwargs)
    return quant_golden(*args, guard_lost_v=True, **kwargs)


QM, QV = fusekit.create_dynamic_map(True), fusekit.create_dynamic_map(False)


def random_quant_case(rng, rows, dim, n):
    """Random codes and absmax (blocks of 256 columns), var, grad, indices with duplicates and
    padding."""
    blocks = (dim + 255) // 256
    m = rng.integers(0, 256, (rows, dim)).astype(np.uint8)
    v = rng.integers(0, 256, (rows, dim)).astype(np.uint8)
    am = (rng.random((rows, blocks)) * 0.1).astype(np.float32)
    av = (rng.random((rows, blocks)) * 0.01).astype(np.float32)
    var = rng.standard_normal((rows, dim)).astype(np.float32)
    grad = rng.standard_normal((n, dim)).astype(np.float32)
    indices = rng.integers(-2, rows, n).astype(np.int32)
    indices[1] = indices[3] = max(indices[0], 0)
    indices[2] = -1
    return m, v, var, am, av, grad, indices


QUANT_NAMES = ("m", "v", "var", "absmax_m", "absmax_v")
FP8_NAMES = ("m codes", "v codes", "var", "scale_m", "scale_v")


def packed(m, v, am, av):
    """The op's state of one table: codes [rows, 2, dim], absmax [rows, 2, blocks]."""
    return np.stack([m, v], axis=1), np.stack([am, av], axis=1)


def unpacked(var, codes, absmax):
    """(m, v, var, absmax_m, absmax_v) of the op's variables, as NumPy arrays."""
    c, a = np.asarray(codes), np.asarray(absmax)
    return c[:, 0], c[:, 1], np.asarray(var), a[:, 0], a[:, 1]


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("dim,index_dtype", [(8, np.int32), (257, np.int64), (40, np.int64)])
def test_resource_quant_op_bitwise(mode, dim, index_dtype):
    rng = np.random.default_rng(SEED + 61 + dim)
    rows, n = 40, 50
    m, v, var, am, av, grad, indices = random_quant_case(rng, rows, dim, n)
    codes, absmax = packed(m, v, am, av)
    tv, tc, ta = tf.Variable(var), tf.Variable(codes), tf.Variable(absmax)
    before = tv.read_value()  # a live read: the op must not write through it

    def step(g, i, lr):
        ft.resource_sparse_apply_lazy_adam_quant(tv, tc, ta, QM, QV, lr, g, i, beta1=B1,
                                                 beta2=B2, epsilon=EPS)

    run = tf.function(step) if mode == "function" else step
    want = (m, v, var, am, av)
    for k, lr in enumerate((0.01, 0.003)):
        run(tf.constant(grad), tf.constant(indices.astype(index_dtype)), tf.constant(lr))
        want = quant_golden(grad, indices, *want, lr)
        got = unpacked(tv.numpy(), tc.numpy(), ta.numpy())
        for name, x, exp in zip(QUANT_NAMES, got, want):
            assert_bitwise(np.ascontiguousarray(x), exp, f"step {k} {name}")
    untouched = np.setdiff1d(np.arange(rows), indices)
    assert untouched.size > 0
    assert_bitwise(tc.numpy()[untouched], codes[untouched], "untouched rows' codes")
    assert_bitwise(before.numpy(), var, "a read taken before the update")


def test_resource_quant_op_refusals():
    rng = np.random.default_rng(SEED + 71)
    m, v, var, am, av, grad, indices = random_quant_case(rng, 12, 8, 6)
    codes, absmax = packed(m, v, am, av)
    originals = (var, codes, absmax)

    def fresh():
        return [tf.Variable(x) for x in originals]

    def call(vs, g=grad, i=indices, qm=QM, qv=QV, lr=0.01):
        return ft.resource_sparse_apply_lazy_adam_quant(*vs, qm, qv, lr, g, i)

    def unchanged(vs, what):
        for name, got, exp in zip(("var", "codes", "absmax"), vs, originals):
            assert_bitwise(got.numpy(), exp, f"{what}: {name} unchanged")

    vs = fresh()
    bad = indices.copy()
    bad[4] = 12
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[4\] = 12"):
        call(vs, i=bad)
    unchanged(vs, "refused index")
    unsorted = QV.copy()
    unsorted[[10, 11]] = unsorted[[11, 10]]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"qmapV\[11\].*ascending"):
        call(vs, qv=unsorted)
    unchanged(vs, "refused map")
    wrong = fresh()
    wrong[1] = tf.Variable(codes.astype(np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="codes must be a uint8 variable, got float"):
        call(wrong)
    with pytest.raises(tf.errors.InvalidArgumentError, match="lr must be a scalar"):
        call(fresh(), lr=tf.constant([0.1, 0.2]))
    for k, shape_bad in ((1, m), (2, absmax[:5]), (2, np.stack([am], axis=1))):
        bad_vs = fresh()
        bad_vs[k] = tf.Variable(shape_bad)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"codes must be \[12, 2, 8\] and absmax \[12, 2, 1\]"):
            call(bad_vs)
        for j, (got, exp) in enumerate(zip(bad_vs, originals)):
            if j != k:
                assert_bitwise(got.numpy(), exp, f"refused shape: variable {j} unchanged")


def random_fp8_case(rng, rows, dim, n):
    """An fp8 state coded from random m and sqrt(v) by the golden (per row and block of 256), with
    the lost-v hazard planted (v's code 0 beside a nonzero m: about one element in eight), a fresh
    row (all zero), a row holding E4M3's NaN code 0x7f in the batch (non-finite state: the row is
    left unchanged), var, grad, indices with duplicates and padding."""
    blocks = (dim + 255) // 256
    m = np.zeros((rows, dim), np.uint8)
    v = np.zeros((rows, dim), np.uint8)
    sm = np.zeros((rows, blocks), np.float32)
    sv = np.zeros((rows, blocks), np.float32)
    mf = (rng.standard_normal((rows, dim)) * 0.1).astype(np.float32)
    sf = np.abs(rng.standard_normal((rows, dim)) * 0.1).astype(np.float32)
    for r in range(1, rows):  # row 0: fresh
        for b in range(blocks):
            cols = slice(256 * b, min(dim, 256 * b + 256))
            m[r, cols], sm[r, b] = fp8_state.quantize_block(mf[r, cols], "e4m3")
            v[r, cols], sv[r, b] = fp8_state.quantize_block(sf[r, cols], "ue4m4")
    v[rng.random((rows, dim)) < 0.125] = 0  # v lost, m kept: the hazard
    var = rng.standard_normal((rows, dim)).astype(np.float32)
    grad = rng.standard_normal((n, dim)).astype(np.float32)
    grad[rng.random((n, dim)) < 0.25] = 0  # no gradient there: the guarded update is m-driven
    indices = rng.integers(-2, rows, n).astype(np.int32)
    indices[1] = indices[3] = max(indices[0], 0)
    indices[2] = -1
    indices[4], indices[5] = 0, rows - 1  # the fresh row, and the NaN row
    m[rows - 1, dim // 2] = 0x7F
    return m, v, var, sm, sv, grad, indices


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("dim", [8, 40, 257])
def test_resource_quant_op_fp8_bitwise(mode, index_dtype, dim):
    """state_format="fp8" against golden/fp8_state.py, bit for bit: var, both codes, both scales,
    two steps; rows outside the batch unchanged; a read held across the update keeps its values."""
    rng = np.random.default_rng(SEED + 101 + dim)
    rows, n = 40, 50
    m, v, var, sm, sv, grad, indices = random_fp8_case(rng, rows, dim, n)
    codes, scales = packed(m, v, sm, sv)
    tv, tc, ts = tf.Variable(var), tf.Variable(codes), tf.Variable(scales)
    before = tv.read_value()

    def step(g, i, lr):
        ft.resource_sparse_apply_lazy_adam_quant(tv, tc, ts, None, None, lr, g, i, beta1=B1,
                                                 beta2=B2, epsilon=EPS, state_format="fp8")

    run = tf.function(step) if mode == "function" else step
    want = (m, v, var, sm, sv)
    unguarded = fp8_golden(grad, indices, *want, 0.01, guard_lost_v=False)
    assert not np.array_equal(unguarded[2], fp8_golden(grad, indices, *want, 0.01)[2]), \
        "the case exercises the lost-v guard"
    for k, lr in enumerate((0.01, 0.003)):
        run(tf.constant(grad), tf.constant(indices.astype(index_dtype)), tf.constant(lr))
        want = fp8_golden(grad, indices, *want, lr)
        got = unpacked(tv.numpy(), tc.numpy(), ts.numpy())
        for name, x, exp in zip(FP8_NAMES, got, want):
            assert_bitwise(np.ascontiguousarray(x), exp, f"step {k} {name}")
    untouched = np.setdiff1d(np.arange(rows), indices)
    assert untouched.size > 0
    assert_bitwise(tc.numpy()[untouched], codes[untouched], "untouched rows' codes")
    assert_bitwise(ts.numpy()[untouched], scales[untouched], "untouched rows' scales")
    assert_bitwise(tv.numpy()[untouched], var[untouched], "untouched rows' var")
    assert_bitwise(tc.numpy()[rows - 1], codes[rows - 1], "the row with a NaN code: unchanged")
    assert_bitwise(before.numpy(), var, "a read taken before the update")


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_resource_quant_op_dynamic_map_lost_v_guard(mode):
    """guard_lost_v=True in the dynamic-map format against golden/lazy_adam_quant.py
    (guard_lost_v=True), bit for bit, with v's code 0 planted beside nonzero m codes; the
    attribute's default (off) is the unguarded golden."""
    rng = np.random.default_rng(SEED + 111)
    rows, dim, n = 40, 40, 50
    m, v, var, am, av, grad, indices = random_quant_case(rng, rows, dim, n)
    v[rng.random((rows, dim)) < 0.125] = 0  # QV[0] = 0: v lost
    m[m == 127] = 200  # QM[127] = 0: every m nonzero
    grad[rng.random((n, dim)) < 0.25] = 0
    assert QV[0] == 0 and QM[200] != 0
    codes, absmax = packed(m, v, am, av)
    for guard in (True, False):
        tv, tc, ta = tf.Variable(var), tf.Variable(codes), tf.Variable(absmax)

        def step(g, i, lr):
            kw = dict(guard_lost_v=True) if guard else {}  # off: the attribute's default
            ft.resource_sparse_apply_lazy_adam_quant(tv, tc, ta, QM, QV, lr, g, i, beta1=B1,
                                                     beta2=B2, epsilon=EPS, **kw)

        run = tf.function(step) if mode == "function" else step
        want = (m, v, var, am, av)
        for k, lr in enumerate((0.01, 0.003)):
            run(tf.constant(grad), tf.constant(indices.astype(np.int64)), tf.constant(lr))
            want = quant_golden(grad, indices, *want, lr, guard_lost_v=guard)
            got = unpacked(tv.numpy(), tc.numpy(), ta.numpy())
            for name, x, exp in zip(QUANT_NAMES, got, want):
                assert_bitwise(np.ascontiguousarray(x), exp, f"guard {guard} step {k} {name}")
    guarded = quant_golden(grad, indices, m, v, var, am, av, 0.01, guard_lost_v=True)
    plain = quant_golden(grad, indices, m, v, var, am, av, 0.01)
    assert not np.array_equal(guarded[2], plain[2]), "the case exercises the lost-v guard"


def test_resource_quant_op_state_format_refusals():
    rng = np.random.default_rng(SEED + 121)
    m, v, var, sm, sv, grad, indices = random_fp8_case(rng, 12, 8, 6)
    codes, scales = packed(m, v, sm, sv)
    tv, tc, ts = tf.Variable(var), tf.Variable(codes), tf.Variable(scales)
    with pytest.raises(ValueError, match=r"state_format must be one of \('dynamic_map', 'fp8'\), "
                                         r"got 'e5m2'"):
        ft.resource_sparse_apply_lazy_adam_quant(tv, tc, ts, None, None, 0.01, grad, indices,
                                                 state_format="e5m2")
    with pytest.raises(ValueError, match="dynamic_map state format needs qmap_m and qmap_v"):
        ft.resource_sparse_apply_lazy_adam_quant(tv, tc, ts, None, None, 0.01, grad, indices)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"qmapM is float32 \[256\] but the fp8 state format has no map"):
        ft.resource_sparse_apply_lazy_adam_quant(tv, tc, ts, QM, QV, 0.01, grad, indices,
                                                 state_format="fp8")
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError),
                       match=r"state_format.*e5m2|e5m2.*state_format"):  # the op itself
        ft.load().fusekit_resource_sparse_apply_lazy_adam_quant(
            tv.handle, tc.handle, ts.handle, tf.zeros([0]), tf.zeros([0]), 0.01, grad, indices,
            beta1=B1, beta2=B2, epsilon=EPS, state_format="e5m2")
    bad = indices.copy()
    bad[4] = 12
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[4\] = 12"):
        ft.resource_sparse_apply_lazy_adam_quant(tv, tc, ts, None, None, 0.01, grad, bad,
                                                 state_format="fp8")
    for name, got, exp in (("var", tv, var), ("codes", tc, codes), ("scales", ts, scales)):
        assert_bitwise(got.numpy(), exp, f"refused: {name} unchanged")


@pytest.mark.parametrize("state_format", ["dynamic_map", "fp8"])
def test_keras_8bit_sparse_and_dense_steps_against_golden(state_format):
    """The 8-bit table against the golden of its format (the lost-v guard on in both) over sparse
    steps (duplicates), then a dense step (every row); a small variable beside it keeps float32
    state and is stepped as LazyAdam steps it."""
    rng = np.random.default_rng(SEED + 81)
    rows, dim, n = 130, 40, 90  # 5,200 elements: 8-bit (>= 4096)
    _, _, var, _, _, grad, indices = random_quant_case(rng, rows, dim, n)
    indices = np.where(indices < 0, 0, indices)  # IndexedSlices from Keras have no padding
    small0 = rng.standard_normal((10, 4)).astype(np.float32)
    table, small, twin = keras.Variable(var), keras.Variable(small0), keras.Variable(small0)
    opt = ft.LazyAdam8bit(learning_rate=0.02, state_format=state_format)
    float_opt = ft.LazyAdam(learning_rate=0.02)
    opt.build([table, small])
    float_opt.build([twin])
    kinds = [(x.dtype, tuple(x.shape)) for x in opt.variables if "iteration" not in x.path
             and "learning_rate" not in x.path]
    assert kinds == [("uint8", (rows, 2, dim)), ("float32", (rows, 2, 1)),
                     ("float32", (10, 4)), ("float32", (10, 4))], kinds
    scales = "scales" if state_format == "fp8" else "absmax"
    assert opt._absmax[0].path.endswith(f"_moment_{scales}"), opt._absmax[0].path
    state = (np.zeros((rows, dim), np.uint8), np.zeros((rows, dim), np.uint8), var,
             np.zeros((rows, 1), np.float32), np.zeros((rows, 1), np.float32))
    small_grad = rng.standard_normal((10, 4)).astype(np.float32)
    for k in range(3):
        lr_t = ft._keras.lazy_adam_step_size(opt.learning_rate, opt.iterations, B1, B2).numpy()
        if k < 2:
            g = tf.IndexedSlices(tf.constant(grad), tf.constant(indices), tf.constant([rows, dim]))
            gi, gv = indices, grad
        else:  # dense: every row
            gv = rng.standard_normal((rows, dim)).astype(np.float32)
            g, gi = tf.constant(gv), np.arange(rows)
        opt.apply_gradients([(g, table), (tf.constant(small_grad), small)])
        float_opt.apply_gradients([(tf.constant(small_grad), twin)])
        state = state_golden(state_format, gv, gi, *state, lr_t)
        got = unpacked(table.numpy(), opt._codes[0].numpy(), opt._absmax[0].numpy())
        for name, x, exp in zip(QUANT_NAMES, got, state):
            assert_bitwise(np.ascontiguousarray(x), exp, f"step {k} {name}")
        assert_bitwise(small.numpy(), twin.numpy(), f"step {k}: the small variable as LazyAdam")


@pytest.mark.parametrize("state_format", ["dynamic_map", "fp8"])
def test_keras_8bit_lost_v_guard_on(state_format):
    """LazyAdam8bit runs the lost-v guard in both formats: a row whose v decodes to zero beside a
    nonzero m, in the batch with a zero gradient, moves by about lr (0.9 lr_t), not by m / eps as
    the unguarded dynamic-map op moves it."""
    rows, dim, lr = 4, 32, 1e-3
    var = np.ones((rows, dim), np.float32)
    if state_format == "fp8":
        m_code, v_code, m_scale = 0x38, 0, 0.1  # m = 1.0 * 0.1; sqrt(v) decodes to 0
    else:
        m_code, v_code, m_scale = 255, 0, 0.1  # m = QM[255] * 0.1 = 0.1; QV[0] = 0
    codes = np.zeros((rows, 2, dim), np.uint8)
    codes[:, 0], codes[:, 1] = m_code, v_code
    scales = np.zeros((rows, 2, 1), np.float32)
    scales[:, 0], scales[:, 1] = m_scale, 0.01
    grad = tf.IndexedSlices(tf.zeros((1, dim)), tf.constant([2]), tf.constant([rows, dim]))
    table = keras.Variable(var)
    opt = ft.LazyAdam8bit(learning_rate=lr, min_8bit_size=0, state_format=state_format)
    opt.build([table])
    opt._codes[0].assign(codes)
    opt._absmax[0].assign(scales)
    opt.apply_gradients([(grad, table)])
    moved = np.abs(table.numpy() - var)
    assert moved[[0, 1, 3]].max() == 0, "rows outside the batch"
    assert 0.5 * 0.9 * lr * np.sqrt(1 - B2) / (1 - B1) < moved[2].min()
    assert moved[2].max() <= lr, moved[2].max()
    if state_format == "dynamic_map":  # the same step without the guard: m / eps
        t2, c2, a2 = tf.Variable(var), tf.Variable(codes), tf.Variable(scales)
        ft.resource_sparse_apply_lazy_adam_quant(t2, c2, a2, QM, QV, lr, tf.zeros((1, dim)),
                                                 tf.constant([2]))
        assert np.abs(t2.numpy() - var)[2].min() > 100 * lr


@pytest.mark.parametrize("state_format", ["dynamic_map", "fp8"])
def test_keras_8bit_lazy_fit_save_load_and_config(tmp_path, state_format):
    rows, dim = 400, 16  # 6,400 elements: 8-bit
    rng = np.random.default_rng(SEED + 91)
    x = rng.integers(0, rows // 2, (256, 3)).astype(np.int32)  # rows >= 200 are never in a batch
    y = (x.sum(axis=1, keepdims=True) % 7 / 7.0).astype(np.float32)
    model = embedding_model(rows, dim, SEED)
    w0 = model.get_layer("table").embeddings.numpy()
    model.compile(ft.LazyAdam8bit(learning_rate=0.01, state_format=state_format), "mse")
    history = model.fit(x, y, batch_size=32, epochs=4, shuffle=False, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < losses[0], losses
    opt = model.optimizer
    assert opt._codes[0].dtype == "uint8"
    w1 = model.get_layer("table").embeddings.numpy()
    assert_bitwise(w1[rows // 2:], w0[rows // 2:], "rows never in a batch")
    assert np.all(opt._codes[0].numpy()[rows // 2:] == 0)
    assert np.all(opt._absmax[0].numpy()[rows // 2:] == 0)
    assert opt._absmax[0].numpy()[np.unique(x), 1].min() > 0  # v's absmax of every row seen
    path = tmp_path / "model8.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is ft.LazyAdam8bit
    assert loaded.optimizer.state_format == state_format
    assert int(loaded.optimizer.iterations) == 32
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        assert a.dtype == b.dtype
        assert_bitwise(b.numpy(), a.numpy(), f"optimizer variable {a.path}")
    for mdl in (model, loaded):
        mdl.fit(x[:64], y[:64], batch_size=32, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.weights, loaded.weights):
        assert_bitwise(b.numpy(), a.numpy(), f"after resuming: {a.path}")
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        assert_bitwise(b.numpy(), a.numpy(), f"after resuming: optimizer variable {a.path}")
    config = keras.optimizers.serialize(
        ft.LazyAdam8bit(beta_1=0.8, min_8bit_size=100, state_format=state_format))
    assert config["config"]["state_format"] == state_format
    again = keras.optimizers.deserialize(config)
    assert type(again) is ft.LazyAdam8bit and again.min_8bit_size == 100 and again.beta_1 == 0.8
    assert again.state_format == state_format and again.get_config() == config["config"]
    del config["config"]["state_format"]  # a configuration saved before the argument existed
    assert keras.optimizers.deserialize(config).state_format == "dynamic_map"
    table = keras.Variable(np.ones((4, 1024), np.float32))
    opt = ft.LazyAdam8bit(state_format=state_format)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[1\] = 9"):
        opt.apply_gradients([(tf.IndexedSlices(tf.ones((2, 1024)), tf.constant([0, 9]),
                                               tf.constant([4, 1024])), table)])
    assert_bitwise(table.numpy(), np.ones((4, 1024), np.float32), "refused: unchanged")


def test_keras_8bit_refusals():
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="min_8bit_size"):
            ft.LazyAdam8bit(min_8bit_size=bad)
    for bad in ("fp16", "FP8", "", None, 1):
        with pytest.raises(ValueError, match=r"^fusekit.tensorflow.LazyAdam8bit: state_format "
                                             r"must be one of \('dynamic_map', 'fp8'\), got "
                                             + re.escape(repr(bad)) + "$"):
            ft.LazyAdam8bit(state_format=bad)
    assert ft.LazyAdam8bit().state_format == "dynamic_map"


def test_recsys_example_runs_small(tmp_path):
    """examples/tensorflow/train_recsys.py end to end at a tiny size (the three optimizers, the
    JSON report): the example keeps working; its figures are docs/tensorflow.md's, not checked."""
    example = pathlib.Path(__file__).resolve().parents[2] / "examples/tensorflow/train_recsys.py"
    out = tmp_path / "recsys.json"
    run = subprocess.run([sys.executable, str(example), "--steps", "4", "--rows", "3000,2000",
                          "--batch", "512", "--heldout", "2000", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    import json
    results = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert sorted(results) == ["fusekit", "fusekit8", "keras"]
    for r in results.values():
        assert len(r["losses"]) == 4 and np.isfinite(r["losses"]).all(), r
    assert results["fusekit8"]["state_bytes"] < 0.5 * results["fusekit"]["state_bytes"]


# ---------------------------------------------------------------------------------------------
# tf_keras' legacy optimizers.
# ---------------------------------------------------------------------------------------------
def test_legacy_lazy_adam():
    tf_keras = pytest.importorskip("tf_keras")
    from fusekit.tensorflow import legacy

    rng = np.random.default_rng(SEED + 61)
    rows, dim, n = 20, 6, 24
    m, v, var, grad, indices = random_case(rng, rows, dim, n)
    indices = np.where(indices < 0, 1, indices)
    table = tf.Variable(var)
    opt = legacy.LazyAdam(learning_rate=0.03)
    m, v = np.zeros_like(m), np.zeros_like(v)  # the slots start at zero
    for k in range(2):
        opt.apply_gradients([(tf.IndexedSlices(tf.constant(grad), tf.constant(indices),
                                               tf.constant([rows, dim])), table)])
        # tf_keras' legacy Adam's bias-corrected step (its _prepare_local), in float32.
        lr_t = tf.constant(0.03) * (tf.sqrt(1 - tf.pow(tf.constant(B2), float(k + 1))) /
                                    (1 - tf.pow(tf.constant(B1), float(k + 1))))
        m, v, var = reference_step(m, v, var, grad, indices, lr_t.numpy())
        assert_bitwise(table.numpy(), var, f"legacy step {k}")
        assert_bitwise(opt.get_slot(table, "m").numpy(), m, f"legacy step {k} m")
    # Dense gradients: tf_keras' legacy Adam, step for step.
    w = rng.standard_normal((5, 3)).astype(np.float32)
    finals = []
    for make in (legacy.LazyAdam, tf_keras.optimizers.legacy.Adam):
        dense = tf.Variable(w)
        o = make(learning_rate=0.01)
        for _ in range(3):
            o.apply_gradients([(tf.constant(w * 0.5 + 1), dense)])
        finals.append(dense.numpy())
    assert_bitwise(finals[0], finals[1], "legacy dense step")
    # A tf_keras model trains with it, lazily.
    tf_keras.utils.set_random_seed(SEED)
    model = tf_keras.Sequential([tf_keras.layers.Embedding(rows, dim, input_length=2),
                                 tf_keras.layers.Flatten(), tf_keras.layers.Dense(1)])
    model.compile(legacy.LazyAdam(0.05), "mse")
    x = np.array([[1, 2], [3, 1]], np.int32)
    model.train_on_batch(x, np.ones((2, 1), np.float32))
    w0 = model.layers[0].embeddings.numpy()
    model.train_on_batch(x + 10, np.ones((2, 1), np.float32))
    w1 = model.layers[0].embeddings.numpy()
    assert_bitwise(w1[[1, 2, 3]], w0[[1, 2, 3]], "legacy: rows outside the second batch")
    config = legacy.LazyAdam(0.05).get_config()
    assert type(legacy.LazyAdam.from_config(config)) is legacy.LazyAdam


# ---------------------------------------------------------------------------------------------
# The package without its op library.
# ---------------------------------------------------------------------------------------------
def test_import_without_op_library_is_a_clear_import_error(tmp_path):
    import fusekit

    package = pathlib.Path(fusekit.__file__).parent
    copy = tmp_path / "fusekit"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("_fusekit_tf_ops.so"))
    run = subprocess.run(
        [sys.executable, "-c", "import fusekit.tensorflow"], capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=300)
    assert run.returncode != 0
    assert "ImportError" in run.stderr and "FUSEKIT_TENSORFLOW=ON" in run.stderr, run.stderr
