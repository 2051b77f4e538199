"""float8: the host casts bit for bit against an independent encoder written here (every code,
every rounding midpoint and its neighbours, overflow, NaN, subnormals), and float8 variables,
constants, streams and weights through a Session. Host float8 data is an array of the
structured dtypes `np_dtype_float8_143/152` (upstream's representation), one code per value."""
import math

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.fp8_utils import host_pow2scale_cast_from_fp8, host_pow2scale_cast_to_fp8

# name -> (exponent bits, mantissa bits, bias): Graphcore's formats, from the reference
FORMATS = {"float8_143": (4, 3, 8), "float8_152": (5, 2, 16)}
DTYPES = {"float8_143": popxl.float8_143, "float8_152": popxl.float8_152}
NP8 = {"float8_143": popxl.dtypes.np_dtype_float8_143,
       "float8_152": popxl.dtypes.np_dtype_float8_152}


def f8(codes, name):
    """uint8 codes as host float8 data of format `name`."""
    return np.asarray(codes, np.uint8).view(NP8[name])


def codes_of(data):
    """The uint8 codes of host float8 data (checking it is float8 data)."""
    assert data.dtype in NP8.values(), data.dtype
    return data.view(np.uint8)


# --- an independent reference: bit formula decode, brute-force nearest encode --------------
def ref_values(name):
    """Value of every code from the bit layout (NaN for 0x80, the only NaN)."""
    e_bits, m_bits, bias = FORMATS[name]
    vals = []
    for code in range(256):
        if code == 0x80:
            vals.append(math.nan)
            continue
        e = (code >> m_bits) & ((1 << e_bits) - 1)
        m = code & ((1 << m_bits) - 1)
        v = m * 2.0 ** (1 - bias - m_bits) if e == 0 else (1 + m / 2 ** m_bits) * 2.0 ** (e - bias)
        vals.append(-v if code & 0x80 else v)
    return np.array(vals)


def ref_encode(x, name, log2_scale=0, nan_on_overflow=True):
    """Nearest code to x*2^s, ties to the even code; |x| at or beyond max + half the top
    spacing overflows (to NaN or to +-max); NaN and +-inf are NaN (upstream's host cast)."""
    e_bits, m_bits, bias = FORMATS[name]
    vals = ref_values(name)
    codes = np.array([c for c in range(256) if c != 0x80])
    cand = vals[codes]
    top = 2.0 ** ((1 << e_bits) - 1 - bias - m_bits)      # spacing of the top binade
    big = np.nanmax(vals)
    out = []
    for v in np.asarray(x, dtype=np.float64).reshape(-1):
        v = math.ldexp(float(v), log2_scale) if math.isfinite(v) else float(v)
        if not math.isfinite(v):
            out.append(0x80)
        elif abs(v) >= big + top / 2:
            out.append(0x80 if nan_on_overflow else (0xFF if v < 0 else 0x7F))
        else:
            d = np.abs(cand - v)
            best = np.flatnonzero(d == d.min())
            out.append(int(min(codes[best], key=lambda c: (c & 1, c))))
    return np.array(out, np.uint8).reshape(np.shape(x))


def probe_values(name):
    """Every value, every midpoint between neighbours and the nearest doubles around it,
    overflow boundaries, infinities, NaN, signed zeros and random values."""
    e_bits, m_bits, bias = FORMATS[name]
    vals = ref_values(name)
    pos = np.unique(vals[~np.isnan(vals) & (vals >= 0)])
    top = 2.0 ** ((1 << e_bits) - 1 - bias - m_bits)
    mids = (pos[:-1] + pos[1:]) / 2
    edges = np.concatenate([mids, [pos[-1] + top / 2, pos[1] / 2, pos[1] / 4]])
    near = np.concatenate([np.nextafter(edges, np.inf), np.nextafter(edges, -np.inf)])
    rng = np.random.default_rng(0)
    rand = np.exp(rng.uniform(np.log(pos[1] / 8), np.log(pos[-1] * 2), 300))
    mags = np.concatenate([pos, edges, near, rand, [pos[-1] * 4, 1e30, np.inf]])
    return np.concatenate([mags, -mags, [np.nan, -0.0]])


@pytest.mark.parametrize("name", FORMATS)
def test_decode_every_code(name):
    codes = np.arange(256, dtype=np.uint8)
    got = host_pow2scale_cast_from_fp8(f8(codes, name), popxl.float32)
    want = ref_values(name)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want.astype(np.float32))     # NaN only at 0x80
    assert np.nanmax(got) == {"float8_143": 240, "float8_152": 57344}[name]


@pytest.mark.parametrize("nan_on_overflow", [True, False])
@pytest.mark.parametrize("name", FORMATS)
def test_encode_matches_reference_bit_for_bit(name, nan_on_overflow):
    x = probe_values(name)
    got = codes_of(host_pow2scale_cast_to_fp8(x, DTYPES[name], 0, nan_on_overflow))
    want = ref_encode(x, name, 0, nan_on_overflow)
    assert got.shape == x.shape
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(x[i], got[i], want[i]) for i in bad[:10]]


@pytest.mark.parametrize("log2_scale", [-32, -7, 3, 31])
@pytest.mark.parametrize("name", FORMATS)
def test_encode_with_log2_scale(name, log2_scale):
    # values placed so that x * 2^s probes the same boundaries
    x = np.ldexp(probe_values(name), -log2_scale)
    np.testing.assert_array_equal(host_pow2scale_cast_to_fp8(x, DTYPES[name], log2_scale),
                                  f8(ref_encode(x, name, log2_scale), name))


@pytest.mark.parametrize("src", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("name", FORMATS)
def test_encode_scalars_and_layouts(src, name):
    """0-d values, ties included, and non-contiguous arrays encode like their elements."""
    with np.errstate(over="ignore"):
        x = probe_values(name).astype(src)           # float16: the largest become inf
    want = ref_encode(x.astype(np.float64), name)
    for i in range(0, x.size, 7):
        assert codes_of(host_pow2scale_cast_to_fp8(x[i], DTYPES[name])) == want[i], x[i]
    strided = np.stack([x, x])[:, ::3].T
    np.testing.assert_array_equal(host_pow2scale_cast_to_fp8(strided, DTYPES[name]),
                                  f8(np.stack([want, want])[:, ::3].T, name))


@pytest.mark.parametrize("src", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("dest", [popxl.float16, popxl.float32, popxl.float64])
def test_encode_input_dtypes_and_round_trip(src, dest):
    """`host_pow2scale_cast_from_fp8(data, dtype, s)` casts to the destination `dtype`; the
    structured dtype of `data` names the float8 format."""
    x = np.array([[0.5, -3.0], [20.0, 112.0]]).astype(src)
    data = host_pow2scale_cast_to_fp8(x, popxl.float8_152, 1)
    assert data.dtype == popxl.dtypes.np_dtype_float8_152 and data.shape == x.shape
    np.testing.assert_array_equal(data, f8(ref_encode(x.astype(np.float64), "float8_152", 1),
                                           "float8_152"))
    back = host_pow2scale_cast_from_fp8(data, dest, -1)
    assert back.dtype == dest.as_numpy()
    np.testing.assert_array_equal(back, x.astype(dest.as_numpy()))   # all exactly representable


def test_from_fp8_rounds_once_to_the_destination():
    """Decoded values times 2^s, rounded once: float8_152's largest times 2 overflows float16
    (to inf) but not float32; its smallest times 2^-10 underflows float16 to 0."""
    big = host_pow2scale_cast_to_fp8(np.array([57344.0, 2.0 ** -17]), popxl.float8_152)
    np.testing.assert_array_equal(host_pow2scale_cast_from_fp8(big, popxl.float16, 1),
                                  np.array([np.inf, 2.0 ** -16], np.float16))
    np.testing.assert_array_equal(host_pow2scale_cast_from_fp8(big, popxl.float32, 1),
                                  np.array([114688.0, 2.0 ** -16], np.float32))
    np.testing.assert_array_equal(host_pow2scale_cast_from_fp8(big, popxl.float16, -10),
                                  np.array([56.0, 0.0], np.float16))


def test_host_float8_data_is_structured_and_views_to_codes():
    data = host_pow2scale_cast_to_fp8([1.0, -2.0], popxl.float8_143)
    assert data.dtype == popxl.dtypes.np_dtype_float8_143 == np.dtype([("float8_143", "u1")])
    assert popxl.float8_143.as_numpy() == popxl.dtypes.np_dtype_float8_143
    assert popxl.dtypes.dtype.as_dtype(data) is popxl.float8_143
    codes = data.view(np.uint8)                      # the codes, without copying
    np.testing.assert_array_equal(codes, ref_encode([1.0, -2.0], "float8_143"))
    again = codes.view(popxl.dtypes.np_dtype_float8_152)   # the same codes read as 1-5-2
    np.testing.assert_array_equal(host_pow2scale_cast_from_fp8(again, popxl.float32),
                                  ref_values("float8_152")[codes].astype(np.float32))


@pytest.mark.parametrize("call,err,match", [
    (lambda: host_pow2scale_cast_to_fp8([1.0], popxl.float16), RuntimeError,
     "^dtype popxl.dtypes.float16 not currently supported"),
    (lambda: host_pow2scale_cast_to_fp8([1.0]), RuntimeError, "^dtype None not currently"),
    (lambda: host_pow2scale_cast_to_fp8([1, 2], popxl.float8_143), RuntimeError,
     "^src.dtype int64 not currently supported"),
    (lambda: host_pow2scale_cast_to_fp8([1.0], popxl.float8_143, 32), ValueError,
     r"\[-32, 32\)"),
    (lambda: host_pow2scale_cast_to_fp8([1.0], popxl.float8_143, 1.5), TypeError, "integer"),
    (lambda: host_pow2scale_cast_from_fp8(np.zeros(2, np.uint8), popxl.float32), RuntimeError,
     r"^src.dtype uint8 not currently supported.*codes.view"),
    (lambda: host_pow2scale_cast_from_fp8(f8([0], "float8_143"), popxl.float8_143),
     RuntimeError, "^dtype popxl.dtypes.float8_143 not currently supported"),
    (lambda: host_pow2scale_cast_from_fp8(f8([0], "float8_143")), RuntimeError,
     "^dtype None not currently supported"),
])
def test_host_cast_errors(call, err, match):
    with pytest.raises(err, match=match):
        call()


# --- float8 tensors through a Session ------------------------------------------------------
def test_variables_and_constants_hold_codes():
    x = np.array([[0.3, -7.0], [300.0, 1e-4]], np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(x, popxl.float8_143, "v", log2_scale=-1)
        sat = popxl.variable(x, popxl.float8_143, "sat", nan_on_overflow=False)
        codes = popxl.variable(host_pow2scale_cast_to_fp8(x, popxl.float8_152), name="codes")
        c = popxl.constant(x, popxl.float8_152, "c", log2_scale=2)
        out = ops.pow2scale_cast_from_fp8(c, -2, popxl.float32)
        s = popxl.d2h_stream(out.shape, out.dtype, "s")
        ops.host_store(s, out)
    assert v.dtype == popxl.float8_143 and v.shape == (2, 2) and c.dtype == popxl.float8_152
    assert codes.dtype == popxl.float8_152          # inferred from the structured dtype
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run()
        got = sess.get_tensors_data([v, sat, codes])
    np.testing.assert_array_equal(got[v], f8(ref_encode(x, "float8_143", -1), "float8_143"))
    np.testing.assert_array_equal(got[sat], f8(ref_encode(x, "float8_143", 0, False),
                                               "float8_143"))
    np.testing.assert_array_equal(got[codes], f8(ref_encode(x, "float8_152"), "float8_152"))
    assert got[v].dtype == popxl.dtypes.np_dtype_float8_143
    want = ref_values("float8_152")[ref_encode(x, "float8_152", 2)].astype(np.float32) / 4
    np.testing.assert_array_equal(res[s], want)


def test_float8_factory_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        with pytest.raises(RuntimeError, match="variable: log2_scale and nan_on_overflow"):
            popxl.variable(np.ones(2), popxl.float32, log2_scale=1)
        with pytest.raises(RuntimeError, match="only for float8"):
            popxl.constant(np.ones(2), nan_on_overflow=True)
        with pytest.raises(TypeError, match="^variable: Type uint8 is not supported for float8 "
                                            "tensors.*codes.view"):
            popxl.variable(np.ones(2, np.uint8), popxl.float8_143)
        with pytest.raises(TypeError, match="Type int64 is not supported for float8"):
            popxl.constant([1, 2], popxl.float8_152)
        with pytest.raises(TypeError, match="Type .*float8_152.* is not supported for float8"):
            popxl.variable(f8([1], "float8_152"), popxl.float8_143)
        with pytest.raises(ValueError, match=r"\[-32, 32\)"):
            popxl.variable(np.ones(2), popxl.float8_143, log2_scale=40)
    got = popxl.utils.to_numpy(np.array([2.0]), popxl.float8_143, log2_scale=1)
    np.testing.assert_array_equal(got, f8(ref_encode([4.0], "float8_143"), "float8_143"))
    assert popxl.utils.to_numpy(got, popxl.float8_143) is not got        # copied
    assert popxl.utils.to_numpy(got, popxl.float8_143, copy=False) is got


def test_float8_streams_and_weight_writes():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.zeros((2, 3)), popxl.float8_143, "w")
        s_in = popxl.h2d_stream((2, 3), popxl.float8_143, "x")
        x = ops.host_load(s_in)
        ops.var_updates.copy_var_update_(w, x)
        s_out = popxl.d2h_stream((2, 3), popxl.float8_143, "y")
        ops.host_store(s_out, x)
    data = host_pow2scale_cast_to_fp8(np.arange(6.0).reshape(2, 3) - 2, popxl.float8_143)
    with popxl.Session(ir, "ipu_hw") as sess:
        assert sess.create_host_outputs()[s_out].dtype == popxl.dtypes.np_dtype_float8_143
        res = sess.run({s_in: data})
        np.testing.assert_array_equal(res[s_out], data)
        np.testing.assert_array_equal(sess.get_tensor_data(w), data)
        # as upstream, a float8 stream also takes the uint8 codes
        res = sess.run({s_in: data[::-1].view(np.uint8)})
        np.testing.assert_array_equal(res[s_out], data[::-1])
        # and run_with_outputs writes into float8 arrays
        outs = {s_out: np.zeros((2, 3), popxl.dtypes.np_dtype_float8_143)}
        sess.run_with_outputs({s_in: data}, outs)
        np.testing.assert_array_equal(outs[s_out], data)
        with pytest.raises(TypeError, match="host_pow2scale_cast_to_fp8"):
            sess.run({s_in: np.zeros((2, 3), np.float32)})
        sess.write_variable_data(w, data[::-1].copy())
        np.testing.assert_array_equal(sess.get_tensor_data(w), data[::-1])
        with pytest.raises(TypeError, match=r"^Data for variable w must be passed in as an "
                                            r"np.array with dtype \[\('float8_143', 'u1'\)\]"):
            sess.write_variable_data(w, 1.0)
        with pytest.raises(TypeError, match=r"^The dtype of the input array uint8 must match "
                                            r"the equivalent type of the tensor w"):
            sess.write_variable_data(w, data.view(np.uint8))
        with pytest.raises(TypeError, match="^The dtype of the input array float32"):
            sess.write_variable_data(w, np.zeros((2, 3), np.float32))


@pytest.mark.parametrize("replicas", [2, 4])
def test_replicated_float8_io_groups_remote_and_rts(replicas):
    rng = np.random.default_rng(replicas)
    groups = 2
    ir = popxl.Ir()
    ir.replication_factor = replicas
    with ir.main_graph:
        rg = ir.replica_grouping(group_size=replicas // groups)
        gdata = rng.normal(size=(groups, 3)).astype(np.float32)
        gv = popxl.variable(gdata, popxl.float8_152, "gv", replica_grouping=rg, log2_scale=2)
        buf = popxl.remote_buffer((3,), popxl.float8_143)
        rdata = rng.normal(size=3).astype(np.float32)
        rv = popxl.remote_variable(rdata, buf, 0, popxl.float8_143, "rv")
        rts_data = rng.normal(size=(5,)).astype(np.float32)
        rts, shard = popxl.replica_sharded_variable(rts_data, popxl.float8_143, "rts")
        s_in = popxl.h2d_stream((3,), popxl.float8_143, "x")
        x = ops.host_load(s_in)
        loaded = ops.remote_load(buf, 0)
        y = ops.concat([ops.pow2scale_cast_from_fp8(t, 0, popxl.float32) for t in
                        (x, loaded, ops.reshape(gv, (3,)))])
        s_out = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(s_out, y)
        s8 = popxl.d2h_stream((3,), popxl.float8_143, "x8")
        ops.host_store(s8, x)
    per_replica = host_pow2scale_cast_to_fp8(rng.normal(size=(replicas, 3)), popxl.float8_143)
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run({s_in: per_replica})
        got = sess.get_tensors_data([gv, rv, rts])

    def dec(codes, name="float8_143"):
        return ref_values(name)[codes].astype(np.float32)
    gcodes = ref_encode(gdata, "float8_152", 2)
    for r in range(replicas):
        want = np.concatenate([dec(codes_of(per_replica[r])),
                               dec(ref_encode(rdata, "float8_143")),
                               dec(gcodes[rg.assignment[r]], "float8_152")])
        np.testing.assert_array_equal(res[s_out][r], want)
    np.testing.assert_array_equal(res[s8], per_replica)
    np.testing.assert_array_equal(got[gv], f8(gcodes, "float8_152"))
    np.testing.assert_array_equal(got[rv], f8(ref_encode(rdata, "float8_143"), "float8_143"))
    np.testing.assert_array_equal(got[rts], f8(ref_encode(rts_data, "float8_143"), "float8_143"))


@pytest.mark.parametrize("name", FORMATS)
def test_float8_views_and_data_movement_keep_the_codes(name):
    """float8 tensors are bytes on the device: slices (in place or not), dynamic slices,
    reshapes, transposes, gathers, subsamples and concatenations move the codes exactly, so
    the result equals the same NumPy indexing of the host float8 data; concatenating the two
    float8 formats is refused as upstream."""
    d = DTYPES[name]
    rng = np.random.default_rng(4)
    data = host_pow2scale_cast_to_fp8(rng.normal(size=(4, 6, 2)) * 4, d)
    other = host_pow2scale_cast_to_fp8(rng.normal(size=(4, 6, 2)), d)
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(data, d, "t")
        u = popxl.variable(other, name="u")            # float8 from the structured dtype
        results = {
            "slice": ops.slice(t, 1, 3, axis=0),
            "slice_": ops.slice_(t, 2, 6, 2, axis=1),
            "dynamic_slice": ops.dynamic_slice(t, popxl.constant(np.uint32([2])), [1], [3],
                                               True),
            "reshape": ops.reshape(t, (8, 6)),
            "transpose": ops.transpose(t, (2, 0, 1)),
            "gather": ops.gather(t, popxl.constant(np.int32([3, 0]))),
            "subsample": ops.subsample(t, [2, 3]),
            "concat": ops.concat([t, u], 1),
        }
        streams = {k: popxl.d2h_stream(v.shape, v.dtype, k) for k, v in results.items()}
        for k, v in results.items():
            ops.host_store(streams[k], v)
        alt = popxl.variable(host_pow2scale_cast_to_fp8(np.ones(2), DTYPES[
            "float8_152" if name == "float8_143" else "float8_143"]), name="alt")
        with pytest.raises(TypeError, match="^All inputs to a concat operation must have the "
                                            "same type"):
            ops.concat([ops.reshape(t, (-1,))[:2], alt])
    want = {"slice": data[1:3], "slice_": data[:, 2:6:2], "dynamic_slice": data[:, 2:5],
            "reshape": data.reshape(8, 6), "transpose": data.transpose(2, 0, 1),
            "gather": data[[3, 0]], "subsample": data[::2, ::3],
            "concat": np.concatenate([data, other], 1)}
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run()
    for k, w in want.items():
        assert res[streams[k]].dtype == NP8[name], k
        np.testing.assert_array_equal(res[streams[k]], w, err_msg=k)
