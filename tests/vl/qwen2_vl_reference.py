#!/usr/bin/env python3
"""Independent float64 numpy reference for Qwen2-VL / Qwen2.5-VL (image input only).

Written from Hugging Face transformers' modeling_qwen2_vl.py, modeling_qwen2_5_vl.py and
modeling_qwen2.py -- NOT from crescent's C++ -- so it can be used to check the C++ port.

  python3 tests/vl/qwen2_vl_reference.py --model DIR --input IN.json --out OUT_DIR
  python3 tests/vl/qwen2_vl_reference.py --window-index 1,8,12 [--model DIR]   # debug aid

IN.json: {"input_ids": [...], "images": [{"pixel_values_npy": "x.npy", "grid_thw": [t,h,w]}],
          "decode_tokens": [...]}   (decode_tokens optional; relative .npy paths are relative
          to IN.json).  Writes embeddings_<i>.npy, positions.npy, logits.npy,
          decode_logits.npy (if decode_tokens) and meta.json into OUT_DIR.
Needs only numpy.  See tests/vl/README.md.
"""
import argparse, glob, json, math, os, struct, sys, time
import numpy as np


# ----------------------------------------------------------------------------- checkpoint
class Checkpoint:
    """Minimal safetensors reader: u64-LE header length, JSON header, raw little-endian data.

    Tensors are memory-mapped and converted to float64 on each access (BF16 -> f32 by putting
    the 16 bits in the high half of a u32).  Names from newer transformers exports
    ("model.language_model.*", "model.visual.*") are mapped to the classic names."""

    RAW = {"BF16": "<u2", "F16": "<f2", "F32": "<f4"}

    def __init__(self, model_dir):
        self.entries = {}
        files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
        if not files:
            sys.exit(f"no *.safetensors in {model_dir}")
        for path in files:
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                if info["dtype"] not in self.RAW:
                    sys.exit(f"{name}: unsupported dtype {info['dtype']}")
                name = name.replace("model.language_model.", "model.").replace("model.visual.", "visual.")
                b, e = info["data_offsets"]
                self.entries[name] = (data, b, e, info["dtype"], tuple(info["shape"]))

    def has(self, name):
        return name in self.entries

    def __call__(self, name, rows=None):
        if name not in self.entries:
            sys.exit(f"missing tensor {name}")
        data, b, e, dtype, shape = self.entries[name]
        arr = data[b:e].view(self.RAW[dtype]).reshape(shape)
        if rows is not None:
            arr = arr[rows]
        if dtype == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        return arr.astype(np.float64)


def load_config(model_dir):
    """Reads config.json the way Qwen2VLConfig / Qwen2_5_VLConfig do (text fields at the top
    level or under text_config, class defaults where a key is absent)."""
    raw = json.load(open(os.path.join(model_dir, "config.json")))
    arch = raw["architectures"][0]
    if arch not in ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration"):
        sys.exit(f"unsupported architecture {arch}")
    is25 = arch.startswith("Qwen2_5")
    text = {**raw, **(raw.get("text_config") or {})}
    rope = text.get("rope_scaling") or text.get("rope_parameters") or {}
    if text.get("use_sliding_window"):
        sys.exit("use_sliding_window=true is not implemented")
    v = raw["vision_config"]
    cfg = dict(
        is25=is25, hidden=text["hidden_size"], layers=text["num_hidden_layers"],
        heads=text["num_attention_heads"], kv_heads=text.get("num_key_value_heads", text["num_attention_heads"]),
        vocab=text["vocab_size"], eps=text.get("rms_norm_eps", 1e-5), act=text.get("hidden_act", "silu"),
        theta=float(text.get("rope_theta", rope.get("rope_theta", 1e6))),
        mrope_section=list(rope["mrope_section"]), tie=bool(text.get("tie_word_embeddings", False)),
        image_token_id=text.get("image_token_id", 151655),
        vision_start_token_id=text.get("vision_start_token_id", 151652),
        v_depth=v["depth"], v_heads=v["num_heads"],
        v_dim=v["hidden_size"] if is25 else v["embed_dim"],
        v_act=v.get("hidden_act", "silu" if is25 else "quick_gelu"),
        merge=v.get("spatial_merge_size", 2), patch=v.get("patch_size", 14),
        window=v.get("window_size", 112), fullatt=list(v.get("fullatt_block_indexes", [])),
        tokens_per_second=v.get("tokens_per_second", 4))
    cfg["head_dim"] = cfg["hidden"] // cfg["heads"]  # Qwen2VLAttention: hidden_size // num_heads
    if 2 * sum(cfg["mrope_section"]) != cfg["head_dim"]:
        sys.exit(f"mrope_section {cfg['mrope_section']} does not cover head_dim {cfg['head_dim']}")
    return cfg


# ----------------------------------------------------------------------------- primitives
def linear(x, w, b=None):
    """nn.Linear: x @ W^T + b."""
    y = x @ w.T
    return y + b if b is not None else y


def rms_norm(x, w, eps):
    """Qwen2RMSNorm: w * x / sqrt(mean(x^2) + eps)."""
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def layer_norm(x, w, b, eps=1e-6):
    """torch.nn.LayerNorm (biased variance), as used by Qwen2-VL's vision blocks and merger."""
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


_erf = np.frompyfunc(math.erf, 1, 1)


def activation(name, x):
    """ACT2FN: silu, quick_gelu (x*sigmoid(1.702x)), gelu (exact erf), gelu_pytorch_tanh."""
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    if name == "quick_gelu":
        return x / (1.0 + np.exp(-1.702 * x))
    if name == "gelu":
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))
    if name == "gelu_pytorch_tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    sys.exit(f"unsupported activation {name}")


def rotate_half(x):
    """rotate_half: cat(-x2, x1) over the last dim."""
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def apply_rope(x, cos, sin):
    """apply_rotary_pos_emb_vision / the q*cos + rotate_half(q)*sin step; x [N, heads, d], cos [N, d]."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def softmax(s):
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


# ----------------------------------------------------------------------------- vision tower
def patch_embed(pixels, W):
    """PatchEmbed / Qwen2_5_VisionPatchEmbed: Conv3d with kernel == stride == (tp, p, p) and no
    bias; each pixel_values row is one (C, tp, p, p) patch, so the conv is a dot product."""
    w = W("visual.patch_embed.proj.weight")
    w = w.reshape(w.shape[0], -1)
    if pixels.shape[1] != w.shape[1]:
        sys.exit(f"pixel rows have {pixels.shape[1]} values, patch embed expects {w.shape[1]}")
    return pixels @ w.T


def vision_rot_pos_emb(grid, head_dim, merge):
    """VisionTransformer.rot_pos_emb + VisionRotaryEmbedding(head_dim // 2, theta=1e4): (h, w)
    of each patch in the processor's merge-block order, repeated over t; [N, head_dim // 2]."""
    t, h, w = grid
    hpos = np.repeat(np.arange(h)[:, None], w, 1).reshape(h // merge, merge, w // merge, merge)
    wpos = np.repeat(np.arange(w)[None, :], h, 0).reshape(h // merge, merge, w // merge, merge)
    hpos, wpos = hpos.transpose(0, 2, 1, 3).ravel(), wpos.transpose(0, 2, 1, 3).ravel()
    dim = head_dim // 2
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    freqs = np.concatenate([np.outer(hpos, inv_freq), np.outer(wpos, inv_freq)], axis=1)
    return np.tile(freqs, (t, 1))


def get_window_index(grid, window_size, merge, patch):
    """Qwen2_5_VisionTransformerPretrainedModel.get_window_index for ONE image (offset 0):
    merged-token permutation grouping tokens window by window, and cu_window_seqlens in patch
    units after torch.unique_consecutive (drops the empty windows the padding creates)."""
    t, h, w = grid
    vws = window_size // merge // patch
    lh, lw = h // merge, w // merge
    pad_h, pad_w = vws - lh % vws, vws - lw % vws  # NB: a full extra window when divisible
    nh, nw = (lh + pad_h) // vws, (lw + pad_w) // vws
    padded = np.full((t, lh + pad_h, lw + pad_w), -100, dtype=np.int64)
    padded[:, :lh, :lw] = np.arange(t * lh * lw).reshape(t, lh, lw)
    padded = padded.reshape(t, nh, vws, nw, vws).transpose(0, 1, 3, 2, 4).reshape(t, nh * nw, vws, vws)
    seqlens = (padded != -100).sum(axis=(2, 3)).reshape(-1)
    flat = padded.reshape(-1)
    index = flat[flat != -100]
    cu = [0] + (np.cumsum(seqlens) * merge * merge).tolist()
    cu = [c for i, c in enumerate(cu) if i == 0 or c != cu[i - 1]]
    return index, cu


def vision_attention(x, W, p, cu, cos, sin, heads):
    """VisionAttention / Qwen2_5_VLVisionAttention: fused qkv, 2-D rope, non-causal softmax
    attention inside each [cu[i], cu[i+1]) segment (the eager per-chunk path), then proj."""
    n, d = x.shape
    qkv = linear(x, W(p + "qkv.weight"), W(p + "qkv.bias")).reshape(n, 3, heads, d // heads)
    q, k, v = apply_rope(qkv[:, 0], cos, sin), apply_rope(qkv[:, 1], cos, sin), qkv[:, 2]
    out = np.empty_like(q)
    for s, e in zip(cu[:-1], cu[1:]):
        sc = np.einsum("qhd,khd->hqk", q[s:e], k[s:e]) / math.sqrt(d // heads)
        out[s:e] = np.einsum("hqk,khd->qhd", softmax(sc), v[s:e])
    return linear(out.reshape(n, d), W(p + "proj.weight"), W(p + "proj.bias"))


def vision_block(x, W, i, cu, cos, sin, cfg):
    """Qwen2VLVisionBlock (LayerNorm, fc1/act/fc2) or Qwen2_5_VLVisionBlock (RMSNorm eps 1e-6,
    gated MLP with biases): x += attn(norm1(x)); x += mlp(norm2(x))."""
    p = f"visual.blocks.{i}."
    if cfg["is25"]:
        norm = lambda y, n: rms_norm(y, W(p + n + ".weight"), 1e-6)
    else:
        norm = lambda y, n: layer_norm(y, W(p + n + ".weight"), W(p + n + ".bias"))
    x = x + vision_attention(norm(x, "norm1"), W, p + "attn.", cu, cos, sin, cfg["v_heads"])
    h = norm(x, "norm2")
    m = p + "mlp."
    if cfg["is25"]:
        g = activation(cfg["v_act"], linear(h, W(m + "gate_proj.weight"), W(m + "gate_proj.bias")))
        h = linear(g * linear(h, W(m + "up_proj.weight"), W(m + "up_proj.bias")),
                   W(m + "down_proj.weight"), W(m + "down_proj.bias"))
    else:
        h = activation(cfg["v_act"], linear(h, W(m + "fc1.weight"), W(m + "fc1.bias")))
        h = linear(h, W(m + "fc2.weight"), W(m + "fc2.bias"))
    return x + h


def patch_merger(x, W, cfg):
    """PatchMerger / Qwen2_5_VLPatchMerger: ln_q (LayerNorm / RMSNorm, eps 1e-6) per patch, view
    merge^2 consecutive patches as one row, Linear -> exact GELU -> Linear."""
    if cfg["is25"]:
        x = rms_norm(x, W("visual.merger.ln_q.weight"), 1e-6)
    else:
        x = layer_norm(x, W("visual.merger.ln_q.weight"), W("visual.merger.ln_q.bias"))
    x = x.reshape(-1, x.shape[1] * cfg["merge"] ** 2)
    x = activation("gelu", linear(x, W("visual.merger.mlp.0.weight"), W("visual.merger.mlp.0.bias")))
    return linear(x, W("visual.merger.mlp.2.weight"), W("visual.merger.mlp.2.bias"))


def vision_tower(pixels, grid, W, cfg):
    """Qwen2VisionTransformerPretrainedModel.forward / Qwen2_5_VisionTransformerPretrainedModel
    .forward for one image -> [t*h*w / merge^2, llm hidden].  Images are independent in the
    batched reference (block-diagonal cu_seqlens, per-image window offsets), so one at a time
    gives the same result."""
    t, h, w = grid
    unit = cfg["merge"] ** 2
    x = patch_embed(pixels, W)
    rot = vision_rot_pos_emb(grid, cfg["v_dim"] // cfg["v_heads"], cfg["merge"])
    cu_full = [f * h * w for f in range(t + 1)]  # full attention is per frame
    if cfg["is25"]:
        win, cu_win = get_window_index(grid, cfg["window"], cfg["merge"], cfg["patch"])
        x = x.reshape(-1, unit, x.shape[1])[win].reshape(x.shape)
        rot = rot.reshape(-1, unit, rot.shape[1])[win].reshape(rot.shape)
    emb = np.concatenate([rot, rot], axis=1)
    cos, sin = np.cos(emb), np.sin(emb)
    for i in range(cfg["v_depth"]):
        cu = cu_full if (not cfg["is25"] or i in cfg["fullatt"]) else cu_win
        x = vision_block(x, W, i, cu, cos, sin, cfg)
    out = patch_merger(x, W, cfg)
    return out[np.argsort(win)] if cfg["is25"] else out


# ----------------------------------------------------------------------------- positions
def image_runs(ids, cfg, grids):
    """Finds the runs of image_token_id and checks them against grid_thw (the reference
    silently mis-assigns positions otherwise): one run per image, run length t*h*w/merge^2,
    each preceded by vision_start (get_rope_index only counts images that follow one)."""
    ids = np.asarray(ids)
    is_img = ids == cfg["image_token_id"]
    starts = [i for i in range(len(ids)) if is_img[i] and (i == 0 or not is_img[i - 1])]
    runs = []
    for s in starts:
        e = s
        while e < len(ids) and is_img[e]:
            e += 1
        runs.append((s, e - s))
    if len(runs) != len(grids):
        sys.exit(f"{len(runs)} image-token runs in input_ids but {len(grids)} images")
    for i, ((s, n), (t, h, w)) in enumerate(zip(runs, grids)):
        if n != t * h * w // cfg["merge"] ** 2:
            sys.exit(f"image {i}: run of {n} image tokens, grid {t}x{h}x{w} needs {t*h*w//cfg['merge']**2}")
        if s == 0 or ids[s - 1] != cfg["vision_start_token_id"]:
            sys.exit(f"image {i}: image run at {s} is not preceded by vision_start")
    return runs


def get_rope_index(ids, runs, grids, cfg):
    """Qwen2VLModel.get_rope_index / Qwen2_5_VLModel.get_rope_index (images, no padding):
    text gets t=h=w=running index; an image gets (t, h, w) grid indices + text_len + st_idx;
    st_idx = max(previous chunk) + 1.  Qwen2.5-VL scales t by second_per_grid_t *
    tokens_per_second with second_per_grid_t = 0 for images.  Returns [3, seq], delta."""
    m = cfg["merge"]
    chunks, st, st_idx = [], 0, 0
    for (ed, n), (t, h, w) in zip(runs, grids):
        lt, lh, lw = t, h // m, w // m
        text_len = ed - st
        chunks.append(np.tile(np.arange(text_len) + st_idx, (3, 1)))
        if cfg["is25"]:  # (arange(t) * second_per_grid_t * tokens_per_second).long(), spgt = 0
            t_idx = (np.arange(lt) * 0.0 * cfg["tokens_per_second"]).astype(np.int64)
        else:
            t_idx = np.arange(lt)
        t_idx = np.repeat(t_idx, lh * lw)
        h_idx = np.tile(np.repeat(np.arange(lh), lw), lt)
        w_idx = np.tile(np.arange(lw), lt * lh)
        chunks.append(np.stack([t_idx, h_idx, w_idx]) + text_len + st_idx)
        st_idx = int(chunks[-1].max()) + 1
        st = ed + lt * lh * lw
    if st < len(ids):
        chunks.append(np.tile(np.arange(len(ids) - st) + st_idx, (3, 1)))
    pos = np.concatenate(chunks, axis=1).astype(np.int64)
    return pos, int(pos.max()) + 1 - len(ids)


# ----------------------------------------------------------------------------- decoder
def mrope_cos_sin(pos, cfg):
    """Qwen2VLRotaryEmbedding.forward + the mrope_section selection of
    apply_multimodal_rotary_pos_emb: inv_freq over head_dim, freqs for each of the 3 position
    rows, cat(freqs, freqs); chunks of mrope_section*2 take row i % 3.  Equivalently, rotary
    pair j < head_dim/2 uses row 0 for j < s0, row 1 for j < s0+s1, else row 2.  [L, head_dim]."""
    hd = cfg["head_dim"]
    inv_freq = 1.0 / (cfg["theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    freqs = pos[:, :, None].astype(np.float64) * inv_freq[None, None, :]  # [3, L, hd/2]
    emb = np.concatenate([freqs, freqs], axis=-1)  # [3, L, hd]
    parts, off = [], 0
    for i, n in enumerate(cfg["mrope_section"] * 2):
        parts.append(emb[i % 3, :, off:off + n])
        off += n
    emb = np.concatenate(parts, axis=-1)
    return np.cos(emb), np.sin(emb)


def decoder_attention(x, W, l, cos, sin, cache, cfg):
    """Qwen2VLAttention.forward (Qwen2 attention + M-RoPE): q/k/v with bias, o without, GQA via
    repeat_kv (query head j reads kv head j // n_rep), scale head_dim^-0.5, causal mask over
    cached + new keys.  cache['k'], cache['v'] hold post-rope keys/values [T, kv_heads, d]."""
    p = f"model.layers.{l}.self_attn."
    n, nh, nkv, hd = x.shape[0], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    q = linear(x, W(p + "q_proj.weight"), W(p + "q_proj.bias")).reshape(n, nh, hd)
    k = linear(x, W(p + "k_proj.weight"), W(p + "k_proj.bias")).reshape(n, nkv, hd)
    v = linear(x, W(p + "v_proj.weight"), W(p + "v_proj.bias")).reshape(n, nkv, hd)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    cache["k"] = k if cache.get("k") is None else np.concatenate([cache["k"], k])
    cache["v"] = v if cache.get("v") is None else np.concatenate([cache["v"], v])
    K, V = np.repeat(cache["k"], nh // nkv, axis=1), np.repeat(cache["v"], nh // nkv, axis=1)
    total = K.shape[0]
    allowed = np.arange(total)[None, :] <= (total - n + np.arange(n))[:, None]
    sc = np.einsum("qhd,khd->hqk", q, K) / math.sqrt(hd)
    sc = np.where(allowed[None], sc, -np.inf)
    out = np.einsum("hqk,khd->qhd", softmax(sc), V).reshape(n, nh * hd)
    return linear(out, W(p + "o_proj.weight"))


def decoder_layer(x, W, l, cos, sin, cache, cfg):
    """Qwen2VLDecoderLayer: pre-RMSNorm attention and SwiGLU MLP (no biases), residuals."""
    p = f"model.layers.{l}."
    x = x + decoder_attention(rms_norm(x, W(p + "input_layernorm.weight"), cfg["eps"]), W, l, cos, sin, cache, cfg)
    h = rms_norm(x, W(p + "post_attention_layernorm.weight"), cfg["eps"])
    g = activation(cfg["act"], linear(h, W(p + "mlp.gate_proj.weight")))
    return x + linear(g * linear(h, W(p + "mlp.up_proj.weight")), W(p + "mlp.down_proj.weight"))


def decoder_forward(embeds, pos, W, caches, cfg):
    """Qwen2VLTextModel.forward + lm_head: layers, final norm, logits = h @ lm_head^T (embed_tokens
    when tie_word_embeddings), computed in vocab chunks to bound memory."""
    cos, sin = mrope_cos_sin(pos, cfg)
    x = embeds
    for l in range(cfg["layers"]):
        x = decoder_layer(x, W, l, cos, sin, caches[l], cfg)
    x = rms_norm(x, W("model.norm.weight"), cfg["eps"])
    head = "model.embed_tokens.weight" if cfg["tie"] else "lm_head.weight"
    step = 16384
    return np.concatenate([x @ W(head, slice(s, s + step)).T for s in range(0, cfg["vocab"], step)], axis=1)


# ----------------------------------------------------------------------------- driver
def run(args):
    t0 = time.time()
    log = lambda msg: print(f"[{time.time() - t0:7.1f}s] {msg}", file=sys.stderr)
    cfg = load_config(args.model)
    W = Checkpoint(args.model)
    spec = json.load(open(args.input))
    base = os.path.dirname(os.path.abspath(args.input))
    ids = [int(i) for i in spec["input_ids"]]
    grids = [tuple(int(g) for g in im["grid_thw"]) for im in spec.get("images", [])]
    runs = image_runs(ids, cfg, grids)
    os.makedirs(args.out, exist_ok=True)

    embeds = W("model.embed_tokens.weight", np.asarray(ids))
    for i, (im, grid, (s, n)) in enumerate(zip(spec.get("images", []), grids, runs)):
        pix = np.load(os.path.join(base, im["pixel_values_npy"])).astype(np.float64)
        if pix.shape[0] != grid[0] * grid[1] * grid[2]:
            sys.exit(f"image {i}: {pix.shape[0]} pixel rows, grid {grid} needs {grid[0]*grid[1]*grid[2]}")
        emb = vision_tower(pix, grid, W, cfg)
        np.save(os.path.join(args.out, f"embeddings_{i}.npy"), emb.astype(np.float32))
        embeds[s:s + n] = emb  # masked_scatter: image i fills its own run, in order
        log(f"image {i} grid {grid}: embeddings {emb.shape}")

    pos, delta = get_rope_index(ids, runs, grids, cfg)
    np.save(os.path.join(args.out, "positions.npy"), pos)
    caches = [dict() for _ in range(cfg["layers"])]
    logits = decoder_forward(embeds, pos, W, caches, cfg)
    np.save(os.path.join(args.out, "logits.npy"), logits.astype(np.float32))
    log(f"prefill {len(ids)} tokens, delta {delta}, logits {logits.shape}")

    meta = dict(arch="qwen2_5_vl" if cfg["is25"] else "qwen2_vl", mrope_position_delta=delta,
                seq_len=len(ids), vocab=cfg["vocab"], logits_shape=list(logits.shape),
                positions_shape=list(pos.shape), image_runs=[list(r) for r in runs],
                embeddings_shapes=[[g[0] * g[1] * g[2] // cfg["merge"] ** 2, cfg["hidden"]] for g in grids],
                argmax_last=int(np.argmax(logits[-1])))
    decode = [int(t) for t in spec.get("decode_tokens", [])]
    if decode:
        rows = []
        for k, tok in enumerate(decode):  # cache_position + rope_deltas, same for t/h/w
            p = np.full((3, 1), len(ids) + k + delta, dtype=np.int64)
            rows.append(decoder_forward(W("model.embed_tokens.weight", np.asarray([tok])), p, W, caches, cfg)[0])
        dl = np.stack(rows)
        np.save(os.path.join(args.out, "decode_logits.npy"), dl.astype(np.float32))
        meta.update(decode_tokens=decode, decode_positions=[len(ids) + k + delta for k in range(len(decode))],
                    decode_logits_shape=list(dl.shape))
        log(f"decoded {len(decode)} tokens")
    json.dump(meta, open(os.path.join(args.out, "meta.json"), "w"), indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="Hugging Face checkout (config.json + *.safetensors)")
    ap.add_argument("--input", help="IN.json")
    ap.add_argument("--out", help="output directory")
    ap.add_argument("--window-index", metavar="T,H,W",
                    help="print Qwen2.5-VL get_window_index for a grid and exit (window/patch/merge "
                         "from --model, else 112/14/2)")
    args = ap.parse_args()
    if args.window_index:
        c = load_config(args.model) if args.model else dict(window=112, patch=14, merge=2)
        grid = tuple(int(v) for v in args.window_index.split(","))
        idx, cu = get_window_index(grid, c["window"], c["merge"], c["patch"])
        print(json.dumps(dict(grid=grid, window_size=c["window"], window_index=idx.tolist(), cu_window_seqlens=cu)))
        return
    if not (args.model and args.input and args.out):
        ap.error("--model, --input and --out are required")
    run(args)


if __name__ == "__main__":
    main()
