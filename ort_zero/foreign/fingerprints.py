"""The transformers code ort_zero's export rewrites replace, as it was in the transformers releases they were tested
with (`versions.TESTED`): per patch, the hashes (`patching.fingerprint`) of the replaced symbol's source. With a
transformers outside `versions.TRANSFORMERS_VERSIONS` a rewrite applies where the installed code hashes the same,
and refuses, naming the model types and the symbol, where it changed. `python -m ort_zero.tools.fingerprints` prints
the installed release's hashes.
"""

# One hash per patch where transformers 5.23.0 and 5.24.0 hold the same code; two (5.23, 5.24) where 5.24 changed it:
# the rotary embeddings' forward lost its @torch.no_grad() (the rewrite computes under no_grad itself), HrmTextStack's
# forward took `cache` for `past_key_values` (the rewrite passes every argument on).
TESTED_SOURCES: dict[str, tuple[str, ...]] = {
    "transformers.llama4_rotary_in_export": ("e09f3552503f2961", "8f2fa823a60a9eb3"),
    "transformers.llama4_apply_rotary_in_export": ("294e060528a9374a",),
    "transformers.deepseek_v2_rotary_in_export": ("e09f3552503f2961", "8f2fa823a60a9eb3"),
    "transformers.deepseek_v2_apply_rotary_in_export": ("b25d09c30045c8bb",),
    "transformers.cpmant_bool_mask_in_export": ("65de3c4906e541f3",),
    "transformers.dbrx_experts_in_export": ("a9a3908afff9662c",),
    "transformers.jetmoe_gating_in_export": ("f22aa1bb678e6fdf",),
    "transformers.jetmoe_experts_in_export": ("f92191cc130129c2",),
    "transformers.longcat_flash_experts_in_export": ("d27768033e0aca30",),
    "transformers.blt_hash_in_export": ("da1b58b483fa7297",),
    "transformers.hrm_text_stack_detached_in_export": ("a26c15c13a9b09e6", "1aacc1a3dcbbfde2"),
    "transformers.experts_in_torch": ("2ea25e59653c89ed",),
}
