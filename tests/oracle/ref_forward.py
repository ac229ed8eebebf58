#!/usr/bin/env python3
"""Independent reference forward pass for small GGUF transformer models.

Pure Python 3 (standard library only), computed in double precision. Written from
the public semantics of the architectures (llama.cpp / HF transformers), not from
this project's C++ code, so that it can serve as a test oracle.

Supported architectures: llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3, granite, gpt-oss.
Supported tensor types: F32, F16, BF16, Q8_0, MXFP4 (matrices; token rows: F32, F16, BF16).

Usage:
  ref_forward.py MODEL.gguf --tokens 1,403,407 [--out all|last]
  ref_forward.py MODEL.gguf --check-golden GOLDEN.json [--greedy N] [--cases N] [--rtol R]
                [--emulate-llamacpp]
See README.md next to this file for what it was validated against.
"""

import argparse
import json
import math
import mmap
import operator
import struct
import sys
import time
from array import array

# ----------------------------------------------------------------------------- GGUF

GGUF_MAGIC = b"GGUF"
T_F32, T_F16, T_BF16, T_Q8_0, T_MXFP4 = 0, 1, 30, 8, 39
# MXFP4 (gpt-oss's experts, ggml's kvalues_mxfp4): E2M1 values doubled, under the half scale
KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
              9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K",
              15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
              20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16",
              26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 39: "MXFP4"}

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B",
           10: "<Q", 11: "<q", 12: "<d"}


class GGUFError(Exception):
    pass


class GGUF:
    def __init__(self, path):
        self.path = path
        self._rows_cache = {}
        f = open(path, "rb")
        self.buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        f.close()
        self.pos = 0
        if self.buf[:4] != GGUF_MAGIC:
            raise GGUFError("%s: not a GGUF file (bad magic)" % path)
        self.pos = 4
        self.version = self._u32()
        if self.version not in (2, 3):
            raise GGUFError("%s: unsupported GGUF version %d (need 2 or 3)" % (path, self.version))
        n_tensors = self._u64()
        n_kv = self._u64()
        self.kv = {}
        for _ in range(n_kv):
            key = self._str()
            vtype = self._u32()
            self.kv[key] = self._value(vtype)
        self.tensors = {}
        for _ in range(n_tensors):
            name = self._str()
            n_dims = self._u32()
            ne = [self._u64() for _ in range(n_dims)]
            ttype = self._u32()
            off = self._u64()
            self.tensors[name] = (ttype, ne, off)
        align = int(self.kv.get("general.alignment", 32))
        self.data_start = (self.pos + align - 1) // align * align

    # low-level readers
    def _unpack(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def _u32(self):
        return self._unpack("<I")

    def _u64(self):
        return self._unpack("<Q")

    def _str(self):
        n = self._u64()
        s = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return s.decode("utf-8", errors="replace")

    def _value(self, vtype):
        if vtype in _SCALAR:
            v = self._unpack(_SCALAR[vtype])
            return bool(v) if vtype == 7 else v
        if vtype == 8:
            return self._str()
        if vtype == 9:
            etype = self._u32()
            count = self._u64()
            if etype in _SCALAR:
                fmt = _SCALAR[etype]
                sz = struct.calcsize(fmt)
                vals = list(struct.unpack_from("<%d%s" % (count, fmt[1]), self.buf, self.pos))
                self.pos += sz * count
                if etype == 7:
                    vals = [bool(x) for x in vals]
                return vals
            return [self._value(etype) for _ in range(count)]
        raise GGUFError("unknown GGUF value type %d" % vtype)

    # tensors
    def has(self, name):
        return name in self.tensors

    def flat(self, name):
        """All values of a tensor as a flat list of Python floats."""
        if name not in self.tensors:
            raise GGUFError("tensor %s missing" % name)
        ttype, ne, off = self.tensors[name]
        n = 1
        for d in ne:
            n *= d
        start = self.data_start + off
        if ttype == T_F32:
            return list(struct.unpack_from("<%df" % n, self.buf, start))
        if ttype == T_F16:
            return list(struct.unpack_from("<%de" % n, self.buf, start))
        if ttype == T_BF16:
            hs = struct.unpack_from("<%dH" % n, self.buf, start)
            a = array("I", [h << 16 for h in hs])
            if sys.byteorder != "little":
                a.byteswap()
            fa = array("f")
            fa.frombytes(a.tobytes())
            if sys.byteorder != "little":
                fa.byteswap()
            return fa.tolist()
        if ttype == T_Q8_0:  # blocks of 32: f16 d, int8 q[32]; x = d q
            out = []
            for b in range(n // 32):
                o = start + 34 * b
                d = struct.unpack_from("<e", self.buf, o)[0]
                out.extend(d * q for q in struct.unpack_from("<32b", self.buf, o + 2))
            return out
        if ttype == T_MXFP4:  # blocks of 32: uint8 e, 16 bytes of nibbles (low: j, high: j + 16)
            out = []
            for b in range(n // 32):
                o = start + 17 * b
                d = math.ldexp(1.0, self.buf[o] - 128)  # 2^(e - 128): E8M0's scale, halved
                qs = self.buf[o + 1:o + 17]
                out.extend(KVALUES_MXFP4[q & 15] * d for q in qs)
                out.extend(KVALUES_MXFP4[q >> 4] * d for q in qs)
            return out
        raise GGUFError("tensor %s has type %s (%d): this oracle supports only F32, F16, BF16, Q8_0 and MXFP4"
                        % (name, TYPE_NAMES.get(ttype, "?"), ttype))

    def matrix(self, name):
        """A 2-D tensor ne=[in, out] as a list of `out` rows of `in` floats."""
        ttype, ne, off = self.tensors[name]
        if len(ne) != 2:
            raise GGUFError("tensor %s: expected 2 dims, got %r" % (name, ne))
        cols, rows = ne
        fl = self.flat(name)
        return [fl[r * cols:(r + 1) * cols] for r in range(rows)]

    def experts(self, name):
        """A 3-D tensor ne=[in, out, n_expert] as a list per expert of `out` rows of `in` floats."""
        ttype, ne, off = self.tensors[name]
        if len(ne) != 3:
            raise GGUFError("tensor %s: expected 3 dims, got %r" % (name, ne))
        cols, rows, n_exp = ne
        fl = self.flat(name)
        return [[fl[(e * rows + r) * cols:(e * rows + r + 1) * cols] for r in range(rows)] for e in range(n_exp)]

    def row(self, name, r):
        """One row of a 2-D tensor (used for the token embedding lookup)."""
        ttype, ne, off = self.tensors[name]
        cols = ne[0]
        start = self.data_start + off
        if ttype == T_F32:
            return list(struct.unpack_from("<%df" % cols, self.buf, start + 4 * cols * r))
        if ttype == T_F16:
            return list(struct.unpack_from("<%de" % cols, self.buf, start + 2 * cols * r))
        if ttype == T_BF16:
            hs = struct.unpack_from("<%dH" % cols, self.buf, start + 2 * cols * r)
            return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in hs]
        if ttype in (T_Q8_0, T_MXFP4):  # (block types: the whole tensor once, then rows of it)
            if name not in self._rows_cache:
                self._rows_cache[name] = self.flat(name)
            return self._rows_cache[name][cols * r:cols * (r + 1)]
        raise GGUFError("tensor %s has type %s (%d): this oracle supports only F32, F16, BF16, Q8_0 and MXFP4"
                        % (name, TYPE_NAMES.get(ttype, "?"), ttype))


# ----------------------------------------------------------------------------- math helpers

_mul = operator.mul


def matvec(W, x):
    return [sum(map(_mul, r, x)) for r in W]


def add(a, b):
    return list(map(operator.add, a, b))


def rmsnorm(x, w, eps):
    # (zip would cut a longer weight silently: a norm of the wrong width must fail here)
    assert len(w) == len(x), "rmsnorm: weight of %d for a vector of %d" % (len(w), len(x))
    ss = sum(map(_mul, x, x)) / len(x)
    s = 1.0 / math.sqrt(ss + eps)
    return [xi * s * wi for xi, wi in zip(x, w)]


def silu(x):
    # x * sigmoid(x), overflow-safe
    if x >= 0:
        return x / (1.0 + math.exp(-x))
    e = math.exp(x)
    return x * e / (1.0 + e)


_GELU_C = math.sqrt(2.0 / math.pi)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + math.tanh(_GELU_C * (x + 0.044715 * x * x * x)))


def swiglu_oai(g, u):
    # gpt-oss's expert activation (llama.cpp's swiglu_oai: alpha 1.702, limit 7): the gate
    # clamped from above, the linear part both ways and offset by one.
    x = min(g, 7.0)
    y = min(max(u, -7.0), 7.0)
    z = 1.702 * x
    sig = 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))
    return x * sig * (y + 1.0)


def softcap(x, cap):
    return cap * math.tanh(x / cap)


_F16 = struct.Struct("<e")


def f16r(x):
    """Round a double to the nearest IEEE half (round-half-even), as an f16 KV cache would."""
    try:
        return _F16.unpack(_F16.pack(x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def f16v(v):
    return [f16r(x) for x in v]


_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


def bf16r(x):
    """Round to f32, then to bf16 with round-half-even (ggml's FP32_TO_BF16)."""
    try:
        u = _U32.unpack(_F32.pack(x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)
    if (u & 0x7fffffff) > 0x7f800000:
        return x
    u = ((u + (0x7fff + ((u >> 16) & 1))) >> 16) << 16
    return _F32.unpack(_U32.pack(u & 0xffffffff))[0]


def bf16v(v):
    return [bf16r(x) for x in v]


def gelu_f16_table(x):
    """ggml CPU's GELU: input rounded to f16, result looked up in an f16 table."""
    if x <= -10.0:
        return 0.0
    if x >= 10.0:
        return x
    return f16r(gelu_tanh(f16r(x)))


# ----------------------------------------------------------------------------- model

ARCH_DEFAULTS = {
    #          eps    freq_base   neox rope  act
    "llama":  (1e-5, 10000.0,   False, "silu"),
    "qwen2":  (1e-6, 1000000.0, True,  "silu"),
    "qwen3":  (1e-6, 1000000.0, True,  "silu"),
    "qwen3moe": (1e-6, 1000000.0, True, "silu"),
    "gemma2": (1e-6, 10000.0,   True,  "gelu"),
    "gemma3": (1e-6, 10000.0,   True,  "gelu"),
    "phi3":   (1e-5, 10000.0,   True,  "silu"),
    "granite": (1e-5, 10000.0,  False, "silu"),
    "gpt-oss": (1e-5, 150000.0, True,  "swiglu_oai"),
    "olmo2":  (1e-6, 10000.0,   True,  "silu"),
    "gemma":  (1e-6, 10000.0,   True,  "gelu"),
    "qwen2moe": (1e-6, 1000000.0, True, "silu"),
}


class Layer:
    pass


class Model:
    def __init__(self, path, emulate=False):
        g = GGUF(path)
        # emulate: reproduce the f16 roundings of llama.cpp's CPU path (diagnostic only; off by
        # default, when everything is plain double math):
        #  - the default F16 KV cache: K and V stored as f16; Q and the softmax probabilities
        #    converted to f16 by the f16 x f32 matmuls that read the cache;
        #  - F16 / BF16 weights: the activation entering each matmul is converted to f16 / bf16;
        #  - GELU through ggml's f16 lookup table.
        self.f16_kv = emulate
        self.emulate = emulate
        self.g = g
        arch = g.kv.get("general.architecture")
        if arch not in ARCH_DEFAULTS:
            raise GGUFError("unsupported architecture %r (supported: %s)"
                            % (arch, ", ".join(sorted(ARCH_DEFAULTS))))
        self.arch = arch
        eps_d, base_d, neox, act = ARCH_DEFAULTS[arch]

        def kv(key, default=None):
            v = g.kv.get(arch + "." + key)
            return default if v is None else v

        self.dim = int(kv("embedding_length"))
        self.n_layer = int(kv("block_count"))
        self.n_ff = int(kv("feed_forward_length"))
        self.H = int(kv("attention.head_count"))
        self.Hkv = int(kv("attention.head_count_kv", self.H))
        self.head_dim = int(kv("attention.key_length", self.dim // self.H))
        self.v_dim = int(kv("attention.value_length", self.head_dim))
        self.eps = float(kv("attention.layer_norm_rms_epsilon", eps_d))
        self.freq_base = float(kv("rope.freq_base", base_d))
        self.n_rot = int(kv("rope.dimension_count", self.head_dim))
        self.freq_scale = 1.0
        self.yarn = None  # (low, high, mscale) when rope.scaling.type is yarn
        st = kv("rope.scaling.type")
        if st == "linear":
            fac = float(kv("rope.scaling.factor", 1.0))
            if fac != 0.0:
                self.freq_scale = 1.0 / fac
        elif st == "yarn":
            # YaRN as llama.cpp's rope_yarn computes it (ext_factor 1): per pair i, the angle mixes
            # theta_interp = theta_extrap / factor and theta_extrap by a ramp between the correction
            # dims of beta_fast / beta_slow rotations over the original context; cos and sin are
            # scaled by 1 + 0.1 ln(factor).
            fac = float(kv("rope.scaling.factor", 1.0))
            orig = float(kv("rope.scaling.original_context_length", kv("context_length", 2048)))
            beta_fast = float(kv("rope.scaling.yarn_beta_fast", 32.0))
            beta_slow = float(kv("rope.scaling.yarn_beta_slow", 1.0))
            self.freq_scale = 1.0 / fac

            def corr_dim(rotations):
                return self.n_rot * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(self.freq_base))
            low = max(0.0, math.floor(corr_dim(beta_fast)))
            high = min(self.n_rot - 1.0, math.ceil(corr_dim(beta_slow)))
            self.yarn = (low, high, 1.0 + 0.1 * math.log(fac))
        elif st not in (None, "none"):
            sys.stderr.write("warning: rope.scaling.type %r ignored (only 'linear' and 'yarn' are implemented)\n" % st)
        self.n_swa = int(kv("attention.sliding_window", 0) or 0)
        self.neox = neox
        if act == "swiglu_oai":
            self.glu = swiglu_oai
        else:
            f = silu if act == "silu" else (gelu_f16_table if emulate else gelu_tanh)
            self.glu = lambda g_, u_: f(g_) * u_
        self.attn_cap = None
        self.final_cap = None
        if arch == "gemma2":
            self.attn_cap = float(kv("attn_logit_softcapping", 50.0))
            self.final_cap = float(kv("final_logit_softcapping", 30.0))

        # attention scale
        self.kq_scale = 1.0 / math.sqrt(self.head_dim)
        if (arch == "gemma2" and self.n_layer == 46) or (arch == "gemma3" and self.n_layer == 62):
            self.kq_scale = 1.0 / math.sqrt(self.dim / self.H)
        # llama.cpp multiplies Q by the scale before K.Q for these (matters only for --f16-kv)
        self.prescale_q = arch in ("gemma", "gemma2", "gemma3", "phi3")

        # per-layer sliding window and rope parameters
        self.rope_factors = None
        if g.has("rope_freqs.weight"):
            self.rope_factors = g.flat("rope_freqs.weight")
        if arch == "phi3" and g.has("rope_factors_short.weight"):
            # the goldens / tests run at a context <= original_context_length: short factors
            self.rope_factors = g.flat("rope_factors_short.weight")

        self.embd_name = "token_embd.weight"
        self.n_vocab = g.tensors[self.embd_name][1][1]
        # (Gemma 1 too: llama.cpp's llm_build_gemma scales the embeddings by sqrt(n_embd))
        self.embd_scale = math.sqrt(self.dim) if arch in ("gemma", "gemma2", "gemma3") else 1.0
        # Granite (llama.cpp's llm_build_granite): embeddings * embedding_scale, each block's
        # output * residual_scale before its residual add, attention.scale as the query scale,
        # logits / logit_scale.
        self.residual_scale, self.logit_scale = 1.0, 1.0
        if arch == "granite":
            self.embd_scale = float(kv("embedding_scale", 1.0))
            self.residual_scale = float(kv("residual_scale", 1.0))
            self.kq_scale = float(kv("attention.scale", self.kq_scale))
            self.logit_scale = float(kv("logit_scale", 1.0))

        self.layers = []
        for il in range(self.n_layer):
            L = Layer()
            p = "blk.%d." % il

            def opt(name):
                return g.flat(p + name) if g.has(p + name) else None

            # OLMo 2 (llama.cpp's llm_build_olmo2, HF's Olmo2DecoderLayer) has no norm before
            # attention or the FFN: each block reads the residual stream itself.
            L.attn_norm = None if arch == "olmo2" else g.flat(p + "attn_norm.weight")
            if g.has(p + "attn_qkv.weight"):
                qkv = g.matrix(p + "attn_qkv.weight")
                nq = self.H * self.head_dim
                nk = self.Hkv * self.head_dim
                L.wq, L.wk, L.wv = qkv[:nq], qkv[nq:nq + nk], qkv[nq + nk:]
                L.rq = L.rk = L.rv = self._rin(p + "attn_qkv.weight")
                L.bq = L.bk = L.bv = None
                if g.has(p + "attn_qkv.bias"):
                    b = g.flat(p + "attn_qkv.bias")
                    L.bq, L.bk, L.bv = b[:nq], b[nq:nq + nk], b[nq + nk:]
            else:
                L.wq = g.matrix(p + "attn_q.weight")
                L.wk = g.matrix(p + "attn_k.weight")
                L.wv = g.matrix(p + "attn_v.weight")
                L.rq, L.rk, L.rv = (self._rin(p + "attn_q.weight"), self._rin(p + "attn_k.weight"),
                                    self._rin(p + "attn_v.weight"))
                L.bq, L.bk, L.bv = opt("attn_q.bias"), opt("attn_k.bias"), opt("attn_v.bias")
            L.wo = g.matrix(p + "attn_output.weight")
            L.ro = self._rin(p + "attn_output.weight")
            L.bo = opt("attn_output.bias")  # gpt-oss
            L.sinks = opt("attn_sinks.weight")  # gpt-oss: (n_head,) one more logit per head
            L.q_norm = L.k_norm = None
            # OLMo 2's q/k norms span the whole projection (H*hd and Hkv*hd), not one head
            L.qk_norm_whole = arch == "olmo2"
            if arch in ("qwen3", "qwen3moe", "gemma3", "olmo2"):
                L.q_norm = g.flat(p + "attn_q_norm.weight")
                L.k_norm = g.flat(p + "attn_k_norm.weight")
                # (whole: q_dim and kv_dim wide; per head: head_dim, shared by the heads)
                nq, nk = ((self.H * self.head_dim, self.Hkv * self.head_dim) if L.qk_norm_whole
                          else (self.head_dim, self.head_dim))
                assert len(L.q_norm) == nq, "%sattn_q_norm.weight: %d wide, expected %d" % (p, len(L.q_norm), nq)
                assert len(L.k_norm) == nk, "%sattn_k_norm.weight: %d wide, expected %d" % (p, len(L.k_norm), nk)
            L.post_attn_norm = L.post_ffw_norm = None
            if arch in ("gemma2", "gemma3", "olmo2"):
                L.post_attn_norm = g.flat(p + "post_attention_norm.weight")
                L.post_ffw_norm = g.flat(p + "post_ffw_norm.weight")
            # (gpt-oss names its pre-FFN norm post_attention_norm, as HF's config does)
            L.ffn_norm = None if arch == "olmo2" else g.flat(
                p + ("post_attention_norm.weight" if arch == "gpt-oss" else "ffn_norm.weight"))
            L.moe = None
            if g.has(p + "ffn_gate_inp.weight"):  # qwen3moe; llama with experts (Mixtral); gpt-oss
                # mixture of experts: router (n_expert, dim); experts' gate/up (ff, dim), down (dim, ff)
                L.moe = (g.matrix(p + "ffn_gate_inp.weight"), g.experts(p + "ffn_gate_exps.weight"),
                         g.experts(p + "ffn_up_exps.weight"), g.experts(p + "ffn_down_exps.weight"),
                         int(kv("expert_used_count")))
                # gpt-oss: the router's bias (n_expert,), the experts' biases (n_expert rows each)
                L.moe_b = None
                if g.has(p + "ffn_gate_inp.bias"):
                    L.moe_b = (g.flat(p + "ffn_gate_inp.bias"), g.matrix(p + "ffn_gate_exps.bias"),
                               g.matrix(p + "ffn_up_exps.bias"), g.matrix(p + "ffn_down_exps.bias"))
                # qwen2moe (llama.cpp's llm_build_qwen2moe): the routed experts' weights are the
                # softmax over all experts, not renormalised over the chosen; a shared expert (its
                # gate vector (dim,), gate/up (ff_shexp, dim), down (dim, ff_shexp)) adds
                # sigmoid(h . gate vector) * its FFN
                L.moe_renorm = arch != "qwen2moe"
                L.shexp = None
                if g.has(p + "ffn_gate_inp_shexp.weight"):
                    L.shexp = (g.flat(p + "ffn_gate_inp_shexp.weight"), g.matrix(p + "ffn_gate_shexp.weight"),
                               g.matrix(p + "ffn_up_shexp.weight"), g.matrix(p + "ffn_down_shexp.weight"))
            elif arch == "phi3" and not g.has(p + "ffn_gate.weight"):
                up = g.matrix(p + "ffn_up.weight")
                L.wgate, L.wup = up[:self.n_ff], up[self.n_ff:]
                L.rg = L.ru = self._rin(p + "ffn_up.weight")
            else:
                L.wgate = g.matrix(p + "ffn_gate.weight")
                L.wup = g.matrix(p + "ffn_up.weight")
                L.rg, L.ru = self._rin(p + "ffn_gate.weight"), self._rin(p + "ffn_up.weight")
            if L.moe is None:
                L.wdown = g.matrix(p + "ffn_down.weight")
                L.rd = self._rin(p + "ffn_down.weight")

            # sliding window
            swa = False
            if self.n_swa > 0:
                if arch == "gemma2":
                    swa = (il % 2 == 0)
                elif arch == "gemma3":
                    swa = ((il + 1) % 6 != 0)
                elif arch == "phi3":
                    swa = True
                elif arch == "gpt-oss":
                    swa = (il % 2 == 0)  # llama.cpp's swa pattern 2
            L.window = self.n_swa if swa else 0
            # rope
            if arch == "gemma3" and swa:
                L.rope = (10000.0, 1.0, None)
            else:
                L.rope = (self.freq_base, self.freq_scale, self.yarn)
            self.layers.append(L)

        self.output_norm = g.flat("output_norm.weight")
        self.out_name = "output.weight" if g.has("output.weight") else self.embd_name
        self.wout = g.matrix(self.out_name)
        self.rout = self._rin(self.out_name)
        self._rope_cache = {}

    def _rin(self, name):
        """Input rounding for a matmul with this weight (identity unless emulating)."""
        if self.emulate:
            t = self.g.tensors[name][0]
            if t == T_F16:
                return f16v
            if t == T_BF16:
                return bf16v
        return lambda v: v

    # ---- rope
    def _cos_sin(self, p, base, scale, yarn=None):
        key = (p, base, scale, yarn)
        cs = self._rope_cache.get(key)
        if cs is None:
            half = self.n_rot // 2
            cos_l, sin_l = [], []
            mscale = 1.0
            for i in range(half):
                theta_extrap = p * base ** (-2.0 * i / self.n_rot)
                if self.rope_factors is not None:
                    theta_extrap /= self.rope_factors[i]
                theta = scale * theta_extrap
                if yarn is not None:
                    low, high, mscale = yarn
                    mix = 1.0 - min(1.0, max(0.0, (i - low) / max(0.001, high - low)))
                    theta = theta * (1.0 - mix) + theta_extrap * mix
                cos_l.append(math.cos(theta) * mscale)
                sin_l.append(math.sin(theta) * mscale)
            cs = (cos_l, sin_l)
            self._rope_cache[key] = cs
        return cs

    def _rope(self, v, cs):
        """Rotate one head vector (length head_dim) in place-free fashion."""
        cos_l, sin_l = cs
        out = list(v)
        half = self.n_rot // 2
        if self.neox:
            for i in range(half):
                a, b = v[i], v[i + half]
                c, s = cos_l[i], sin_l[i]
                out[i] = a * c - b * s
                out[i + half] = a * s + b * c
        else:
            for i in range(half):
                a, b = v[2 * i], v[2 * i + 1]
                c, s = cos_l[i], sin_l[i]
                out[2 * i] = a * c - b * s
                out[2 * i + 1] = a * s + b * c
        return out

    # ---- forward
    def new_cache(self):
        # per layer: list per KV head of [list of k vectors], [list of v vectors]
        # router_margin: per position, the smallest gap over the layers between the k-th and the
        # (k+1)-th router logit (mixtures of experts; where it is tiny, an engine's rounding may
        # pick the other expert, a legitimate jump of that position's and the later logits)
        return {"n": 0, "k": [[[] for _ in range(self.Hkv)] for _ in range(self.n_layer)],
                "v": [[[] for _ in range(self.Hkv)] for _ in range(self.n_layer)], "router_margin": {}}

    def forward(self, tokens, cache, want="all"):
        """Process `tokens` at positions cache['n']...; returns logits rows
        (one per position for want='all', only the last for 'last')."""
        g = self.g
        hd, H, Hkv = self.head_dim, self.H, self.Hkv
        vd = self.v_dim
        group = H // Hkv
        eps = self.eps
        p0 = cache["n"]
        n = len(tokens)
        for t in tokens:
            if not (0 <= t < self.n_vocab):
                raise GGUFError("token id %d out of range [0, %d)" % (t, self.n_vocab))
        xs = [g.row(self.embd_name, t) for t in tokens]
        if self.embd_scale != 1.0:
            s = self.embd_scale
            xs = [[v * s for v in x] for x in xs]

        for il, L in enumerate(self.layers):
            kc = cache["k"][il]
            vc = cache["v"][il]
            base, scale, yarn = L.rope
            new_q = []
            for i, x in enumerate(xs):
                p = p0 + i
                h = x if L.attn_norm is None else rmsnorm(x, L.attn_norm, eps)
                q = matvec(L.wq, L.rq(h))
                k = matvec(L.wk, L.rk(h))
                v = matvec(L.wv, L.rv(h))
                if L.bq is not None:
                    q = add(q, L.bq)
                if L.bk is not None:
                    k = add(k, L.bk)
                if L.bv is not None:
                    v = add(v, L.bv)
                if L.qk_norm_whole:
                    q = rmsnorm(q, L.q_norm, eps)
                    k = rmsnorm(k, L.k_norm, eps)
                cs = self._cos_sin(p, base, scale, yarn)
                qh = []
                for j in range(H):
                    qj = q[j * hd:(j + 1) * hd]
                    if L.q_norm is not None and not L.qk_norm_whole:
                        qj = rmsnorm(qj, L.q_norm, eps)
                    qj = self._rope(qj, cs)
                    if self.f16_kv:
                        qj = f16v([t * self.kq_scale for t in qj]) if self.prescale_q else f16v(qj)
                    qh.append(qj)
                new_q.append(qh)
                for j in range(Hkv):
                    kj = k[j * hd:(j + 1) * hd]
                    if L.k_norm is not None and not L.qk_norm_whole:
                        kj = rmsnorm(kj, L.k_norm, eps)
                    kj = self._rope(kj, cs)
                    vj = v[j * vd:(j + 1) * vd]
                    if self.f16_kv:
                        kj, vj = f16v(kj), f16v(vj)
                    kc[j].append(kj)
                    vc[j].append(vj)

            new_xs = []
            for i, x in enumerate(xs):
                p = p0 + i
                lo = 0
                if L.window > 0:
                    lo = max(0, p - L.window + 1)  # visible iff p - j < W
                att = []
                sc = 1.0 if (self.f16_kv and self.prescale_q) else self.kq_scale
                for j in range(H):
                    kvh = j // group
                    qj = new_q[i][j]
                    ks = kc[kvh]
                    scores = [sum(map(_mul, qj, ks[t])) * sc for t in range(lo, p + 1)]
                    if self.attn_cap is not None:
                        cap = self.attn_cap
                        scores = [cap * math.tanh(s_ / cap) for s_ in scores]
                    m = max(scores)
                    if L.sinks is not None:  # gpt-oss: the sink counts in the max and the sum only
                        m = max(m, L.sinks[j])
                    e = [math.exp(s_ - m) for s_ in scores]
                    z = sum(e)
                    if L.sinks is not None:
                        z += math.exp(L.sinks[j] - m)
                    probs = [w / z for w in e]
                    if self.f16_kv:
                        probs = f16v(probs)
                    vs = vc[kvh][lo:p + 1]
                    att.extend(sum(map(_mul, probs, col)) for col in zip(*vs))
                a = matvec(L.wo, L.ro(att))
                if L.bo is not None:
                    a = add(a, L.bo)
                if L.post_attn_norm is not None:
                    a = rmsnorm(a, L.post_attn_norm, eps)
                x = add(x, [v * self.residual_scale for v in a])
                h = x if L.ffn_norm is None else rmsnorm(x, L.ffn_norm, eps)
                glu = self.glu
                if L.moe is not None and L.moe_b is not None:
                    # gpt-oss (llama.cpp's build_moe_ffn with softmax-weight gating): the k
                    # largest of the router's logits (+ bias), weighted by the softmax of those k;
                    # each expert's gate, up and down with their biases, swiglu_oai between.
                    router, gates, ups, downs, k = L.moe
                    rb, gb, ub, db = L.moe_b
                    logits = add(matvec(router, h), rb)
                    order = sorted(range(len(logits)), key=lambda e: -logits[e])
                    top = order[:k]
                    if k < len(order):
                        gap = logits[order[k - 1]] - logits[order[k]]
                        cache["router_margin"][p] = min(gap, cache["router_margin"].get(p, gap))
                    mx = logits[top[0]]
                    ws = [math.exp(logits[e] - mx) for e in top]
                    z = sum(ws)
                    f = [0.0] * len(x)
                    for e, w in zip(top, ws):
                        gt = add(matvec(gates[e], h), gb[e])
                        up = add(matvec(ups[e], h), ub[e])
                        y = add(matvec(downs[e], [glu(gv, uv) for gv, uv in zip(gt, up)]), db[e])
                        f = [fv + w / z * yv for fv, yv in zip(f, y)]
                elif L.moe is not None:
                    # llama.cpp's build_moe_ffn (softmax gating, weights normalised): the softmax of
                    # the router's logits over all experts, the k most probable experts (argsort,
                    # descending), their probabilities renormalised to sum 1, and the sum of those
                    # experts' FFNs weighted by them.
                    router, gates, ups, downs, k = L.moe
                    logits = matvec(router, h)
                    mx = max(logits)
                    probs = [math.exp(v - mx) for v in logits]
                    z = sum(probs)
                    probs = [v / z for v in probs]
                    order = sorted(range(len(logits)), key=lambda e: -logits[e])
                    top = order[:k]
                    if k < len(order):
                        gap = logits[order[k - 1]] - logits[order[k]]
                        cache["router_margin"][p] = min(gap, cache["router_margin"].get(p, gap))
                    wsum = sum(probs[e] for e in top) if L.moe_renorm else 1.0
                    f = [0.0] * len(x)
                    for e in top:
                        gt = matvec(gates[e], h)
                        up = matvec(ups[e], h)
                        y = matvec(downs[e], [glu(gv, uv) for gv, uv in zip(gt, up)])
                        f = [fv + probs[e] / wsum * yv for fv, yv in zip(f, y)]
                    if L.shexp is not None:
                        sg, sgate, sup, sdown = L.shexp
                        gl = sum(map(_mul, h, sg))
                        gate = 1.0 / (1.0 + math.exp(-gl))
                        y = matvec(sdown, [glu(gv, uv) for gv, uv in zip(matvec(sgate, h), matvec(sup, h))])
                        f = [fv + gate * yv for fv, yv in zip(f, y)]
                else:
                    gt = matvec(L.wgate, L.rg(h))
                    up = matvec(L.wup, L.ru(h))
                    f = matvec(L.wdown, L.rd([glu(gv, uv) for gv, uv in zip(gt, up)]))
                if L.post_ffw_norm is not None:
                    f = rmsnorm(f, L.post_ffw_norm, eps)
                new_xs.append(add(x, [v * self.residual_scale for v in f]))
            xs = new_xs

        cache["n"] = p0 + n
        rows = xs if want == "all" else xs[-1:]
        out = []
        for x in rows:
            h = rmsnorm(x, self.output_norm, eps)
            lg = [v / self.logit_scale for v in matvec(self.wout, self.rout(h))]
            if self.final_cap is not None:
                cap = self.final_cap
                lg = [cap * math.tanh(v / cap) for v in lg]
            out.append(lg)
        return out


# ----------------------------------------------------------------------------- golden check

def argmax(v):
    best, bi = v[0], 0
    for i, x in enumerate(v):
        if x > best:
            best, bi = x, i
    return bi


def check_golden(model, path, rtol, greedy_limit, max_cases):
    gold = json.load(open(path))
    cases = gold["cases"]
    if max_cases is not None:
        cases = cases[:max_cases]
    ok_all = True
    for ci, case in enumerate(cases):
        t0 = time.time()
        toks = case["prompt_tokens"]
        ref = case["top10_per_position"]
        cache = model.new_cache()
        logits = model.forward(toks, cache, "all")
        max_diff = 0.0
        max_abs = 0.0
        top1_ok = True
        bad_pos = []
        for pos, (row, r10) in enumerate(zip(logits, ref)):
            for tid, lv in r10:
                max_diff = max(max_diff, abs(row[tid] - lv))
                max_abs = max(max_abs, abs(lv))
            if argmax(row) != r10[0][0]:
                top1_ok = False
                bad_pos.append((pos, argmax(row), r10[0][0], r10[0][1] - r10[1][1]))
        tol = rtol * max(1.0, max_abs)
        # greedy continuation, one token at a time with the KV cache
        gref = case.get("greedy_tokens", [])
        n_g = len(gref) if greedy_limit is None else min(greedy_limit, len(gref))
        ours = []
        last = logits[-1]
        margin = None
        for step in range(n_g):
            t = argmax(last)
            ours.append(t)
            if t != gref[step]:
                margin = last[t] - last[gref[step]]
            if t != gref[step]:
                break
            if step + 1 < n_g:
                last = model.forward([t], cache, "last")[0]
        g_ok = ours == gref[:n_g]
        first_mismatch = None
        if not g_ok:
            first_mismatch = len(ours) - 1
        passed = top1_ok and max_diff <= tol and g_ok
        ok_all = ok_all and passed
        print("case %d: %d prompt tokens: max|diff| over ref top-10 = %.3g (max|logit| %.3g, tol %.3g), "
              "top-1 agrees at every position: %s, greedy %d/%d tokens: %s  [%.1f s] %s"
              % (ci, len(toks), max_diff, max_abs, tol, "yes" if top1_ok else "NO %r" % bad_pos,
                 len(ours) if g_ok else first_mismatch, n_g,
                 "match" if g_ok else "MISMATCH at step %d (ours %d, ref %d, our logit margin %.3g)"
                 % (first_mismatch, ours[-1], gref[first_mismatch], margin),
                 time.time() - t0, "PASS" if passed else "FAIL"))
        sys.stdout.flush()
    return ok_all


def make_golden(model, prompts, n_greedy):
    """A golden file (../shared/models/README.md's format) of this model: per prompt the top-10
    logits at every position and the greedy continuation of n_greedy tokens."""
    cases = []
    for toks in prompts:
        cache = model.new_cache()
        logits = model.forward(toks, cache, "all")
        top10 = [sorted(((i, v) for i, v in enumerate(row)), key=lambda e: (-e[1], e[0]))[:10] for row in logits]
        greedy, last = [], logits[-1]
        for step in range(n_greedy):
            greedy.append(argmax(last))
            if step + 1 < n_greedy:
                last = model.forward([greedy[-1]], cache, "last")[0]
        case = {"prompt_tokens": toks, "n_vocab": model.n_vocab,
                "top10_per_position": [[[i, v] for i, v in row] for row in top10], "greedy_tokens": greedy}
        if cache["router_margin"]:  # (positions 0 .. prompt + greedy - 2: every position run)
            case["router_margin"] = [cache["router_margin"][p] for p in sorted(cache["router_margin"])]
        cases.append(case)
    return {"model": model.g.path, "reference": "tests/oracle/ref_forward.py", "cases": cases}


# ----------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description="Independent pure-Python reference forward pass for GGUF models.")
    ap.add_argument("model")
    ap.add_argument("--tokens", help="comma-separated token ids")
    ap.add_argument("--out", choices=["all", "last"], default="all")
    ap.add_argument("--check-golden", metavar="GOLDEN.json")
    ap.add_argument("--rtol", type=float, default=None,
                    help="golden tolerance: max|diff| <= rtol * max(1, max|ref logit|); default 2e-3, "
                         "or 1e-2 when a matmul weight is BF16 (the reference rounds the activations "
                         "to bf16 then)")
    ap.add_argument("--greedy", type=int, default=None,
                    help="check at most this many greedy tokens per case (default: all)")
    ap.add_argument("--emulate-llamacpp", action="store_true",
                    help="diagnostic: reproduce llama.cpp CPU's f16 roundings (F16 KV cache, f16/bf16 "
                         "activations into F16/BF16 matmuls, f16 GELU table); explains most of the "
                         "residual difference to llama.cpp goldens")
    ap.add_argument("--cases", type=int, default=None, help="check only the first N golden cases")
    ap.add_argument("--golden-out", action="store_true",
                    help="print a golden file of this model for --prompts (with --greedy N tokens each)")
    ap.add_argument("--prompts", help="--golden-out's prompts: token-id lists separated by ';'")
    args = ap.parse_args()

    try:
        t0 = time.time()
        model = Model(args.model, emulate=args.emulate_llamacpp)
        if args.check_golden:
            print("%s: arch %s, %d layers, dim %d, heads %d/%d, head_dim %d, vocab %d (loaded in %.1f s)"
                  % (args.model, model.arch, model.n_layer, model.dim, model.H, model.Hkv,
                     model.head_dim, model.n_vocab, time.time() - t0))
            rtol = args.rtol
            if rtol is None:
                has_bf16 = any(t[0] == T_BF16 and len(t[1]) == 2 for t in model.g.tensors.values())
                rtol = 1e-2 if has_bf16 else 2e-3
            print("tolerance: max|diff| <= %g * max(1, max|ref logit|)%s"
                  % (rtol, ", emulating llama.cpp's f16 roundings" if args.emulate_llamacpp else ""))
            ok = check_golden(model, args.check_golden, rtol, args.greedy, args.cases)
            print("RESULT: %s (total %.1f s)" % ("PASS" if ok else "FAIL", time.time() - t0))
            return 0 if ok else 1
        if args.golden_out:
            if not args.prompts:
                ap.error("--golden-out needs --prompts")
            prompts = [[int(t) for t in p.split(",") if t.strip()] for p in args.prompts.split(";")]
            if any(not p for p in prompts):
                ap.error("--prompts has an empty prompt")
            json.dump(make_golden(model, prompts, args.greedy or 0), sys.stdout)
            sys.stdout.write("\n")
            return 0
        if not args.tokens:
            ap.error("--tokens, --check-golden or --golden-out is required")
        toks = [int(t) for t in args.tokens.split(",") if t.strip() != ""]
        if not toks:
            ap.error("--tokens is empty")
        logits = model.forward(toks, model.new_cache(), args.out)
        json.dump({"arch": model.arch, "n_vocab": model.n_vocab, "logits": logits}, sys.stdout)
        sys.stdout.write("\n")
        return 0
    except GGUFError as e:
        sys.stderr.write("error: %s\n" % e)
        return 2


if __name__ == "__main__":
    sys.exit(main())
