#!/usr/bin/env python3
"""Writes a tiny random Qwen2-VL or Qwen2.5-VL checkpoint (config.json + BF16 model.safetensors)
and, with --with-input, an example IN.json + pixel .npy files for qwen2_vl_reference.py.

  python3 tests/vl/make_tiny_checkpoint.py --variant qwen2_vl   --out /tmp/tiny2vl  --with-input
  python3 tests/vl/make_tiny_checkpoint.py --variant qwen2_5_vl --out /tmp/tiny25vl --with-input

Sizes: LLM hidden 64, 2 layers, 4 heads / 2 kv heads (head_dim 16), intermediate 128, vocab
151936, mrope_section [2,3,3], rope_theta 1e6; vision width 32, 2 heads, patch 14, merge 2,
temporal patch 2.  qwen2_vl: vision depth 2, mlp_ratio 4, quick_gelu, LayerNorm, untied lm_head.
qwen2_5_vl: vision depth 4, intermediate 64, silu, RMSNorm, window_size 56, fullatt [1,3],
tied word embeddings.  Needs only numpy; the safetensors writer is in this file.
"""
import argparse, json, os, struct
import numpy as np

IMAGE, VIDEO, VSTART, VEND = 151655, 151656, 151652, 151653


def to_bf16_bits(a):
    """float32 -> bfloat16 bit pattern (round to nearest even), as uint16."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def write_safetensors(path, tensors, dtype="BF16"):
    """Minimal safetensors writer: u64-LE header length, JSON header (padded with spaces to a
    multiple of 8), then the raw little-endian tensor bytes in header order."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, arr in tensors.items():
        raw = to_bf16_bits(arr).tobytes() if dtype == "BF16" else np.asarray(arr, "<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def make(variant, out, seed, tie):
    rng = np.random.default_rng(seed)
    is25 = variant == "qwen2_5_vl"
    H, L, NH, NKV, I, V = 64, 2, 4, 2, 128, 151936
    VD, VH, P, M, TP, C = 32, 2, 14, 2, 2, 3
    hd = H // NH
    lin = lambda o, i: rng.normal(0, 1 / np.sqrt(i), (o, i))
    bias = lambda n: rng.normal(0, 0.1, n)
    normw = lambda n: 1 + rng.normal(0, 0.1, n)
    t = {"model.embed_tokens.weight": rng.normal(0, 1, (V, H))}
    for l in range(L):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = normw(H)
        t[p + "post_attention_layernorm.weight"] = normw(H)
        for n, o in (("q", NH * hd), ("k", NKV * hd), ("v", NKV * hd)):
            t[p + f"self_attn.{n}_proj.weight"] = lin(o, H)
            t[p + f"self_attn.{n}_proj.bias"] = bias(o)
        t[p + "self_attn.o_proj.weight"] = lin(H, NH * hd)
        t[p + "mlp.gate_proj.weight"] = lin(I, H)
        t[p + "mlp.up_proj.weight"] = lin(I, H)
        t[p + "mlp.down_proj.weight"] = lin(H, I)
    t["model.norm.weight"] = normw(H)
    if not tie:
        t["lm_head.weight"] = lin(V, H)
    t["visual.patch_embed.proj.weight"] = rng.normal(0, 1 / np.sqrt(C * TP * P * P), (VD, C, TP, P, P))
    depth = 4 if is25 else 2
    VI = 64 if is25 else 4 * VD
    for b in range(depth):
        p = f"visual.blocks.{b}."
        for n in ("norm1", "norm2"):
            t[p + n + ".weight"] = normw(VD)
            if not is25:
                t[p + n + ".bias"] = bias(VD)
        t[p + "attn.qkv.weight"], t[p + "attn.qkv.bias"] = lin(3 * VD, VD), bias(3 * VD)
        t[p + "attn.proj.weight"], t[p + "attn.proj.bias"] = lin(VD, VD), bias(VD)
        if is25:
            for n, (o, i) in (("gate_proj", (VI, VD)), ("up_proj", (VI, VD)), ("down_proj", (VD, VI))):
                t[p + f"mlp.{n}.weight"], t[p + f"mlp.{n}.bias"] = lin(o, i), bias(o)
        else:
            t[p + "mlp.fc1.weight"], t[p + "mlp.fc1.bias"] = lin(VI, VD), bias(VI)
            t[p + "mlp.fc2.weight"], t[p + "mlp.fc2.bias"] = lin(VD, VI), bias(VD)
    t["visual.merger.ln_q.weight"] = normw(VD)
    if not is25:
        t["visual.merger.ln_q.bias"] = bias(VD)
    MH = VD * M * M
    t["visual.merger.mlp.0.weight"], t["visual.merger.mlp.0.bias"] = lin(MH, MH), bias(MH)
    t["visual.merger.mlp.2.weight"], t["visual.merger.mlp.2.bias"] = lin(H, MH), bias(H)

    if is25:
        vision = dict(depth=depth, hidden_size=VD, intermediate_size=VI, num_heads=VH, out_hidden_size=H,
                      hidden_act="silu", in_chans=C, patch_size=P, spatial_merge_size=M, temporal_patch_size=TP,
                      window_size=56, fullatt_block_indexes=[1, 3], tokens_per_second=2)
    else:
        vision = dict(depth=depth, embed_dim=VD, num_heads=VH, mlp_ratio=4, hidden_size=H, hidden_act="quick_gelu",
                      in_chans=C, patch_size=P, spatial_merge_size=M, temporal_patch_size=TP)
    config = dict(
        architectures=["Qwen2_5_VLForConditionalGeneration" if is25 else "Qwen2VLForConditionalGeneration"],
        model_type=variant, hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
        num_key_value_heads=NKV, vocab_size=V, hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1000000.0,
        max_position_embeddings=32768, max_window_layers=L, use_sliding_window=False, sliding_window=32768,
        tie_word_embeddings=tie, torch_dtype="bfloat16", bos_token_id=151643, eos_token_id=151645,
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VSTART, vision_end_token_id=VEND,
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, vision_config=vision)
    os.makedirs(out, exist_ok=True)
    json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=1)
    write_safetensors(os.path.join(out, "model.safetensors"), t)
    return rng, C * TP * P * P, M


def make_input(out, rng, patch_dim, merge, grids=((1, 8, 8), (1, 6, 10))):
    """Prompt: text, <vision_start> image0 <vision_end>, text, <vision_start> image1 <vision_end>, text."""
    text = lambda n: rng.integers(0, 151643, n).tolist()
    ids, images = text(3), []
    for i, (t, h, w) in enumerate(grids):
        ids += [VSTART] + [IMAGE] * (t * h * w // merge ** 2) + [VEND] + text(2 + i)
        npy = f"pixels_{i}.npy"
        np.save(os.path.join(out, npy), rng.normal(0, 1, (t * h * w, patch_dim)).astype(np.float32))
        images.append({"pixel_values_npy": npy, "grid_thw": [t, h, w]})
    spec = {"input_ids": ids, "images": images, "decode_tokens": text(3)}
    json.dump(spec, open(os.path.join(out, "input.json"), "w"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=["qwen2_vl", "qwen2_5_vl"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tie", choices=["default", "yes", "no"], default="default",
                    help="tie_word_embeddings (default: no for qwen2_vl, yes for qwen2_5_vl)")
    ap.add_argument("--with-input", action="store_true", help="also write input.json + pixels_<i>.npy")
    a = ap.parse_args()
    tie = (a.variant == "qwen2_5_vl") if a.tie == "default" else a.tie == "yes"
    rng, patch_dim, merge = make(a.variant, a.out, a.seed, tie)
    if a.with_input:
        make_input(a.out, rng, patch_dim, merge)
    print(f"wrote {a.variant} tiny checkpoint to {a.out}")


if __name__ == "__main__":
    main()
