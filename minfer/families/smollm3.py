"""smollm3 (src/models/smollm3.cpp): SmolLM3, llama's graph with no RoPE on every 4th layer
(hparams.n_no_rope_layer_step = 4, fixed: layers 3, 7, 11, ... attend without rotation; no key
says so). convert_hf_to_gguf.py's SmolLM3Model is LlamaModel's with the arch renamed."""

from __future__ import annotations

from minfer.families.schema import Family

NO_ROPE_STEP = 4  # llama.cpp: use_rope = (il + 1) % n_no_rope_layer_step != 0


class SmolLM3(Family):
    def hparams(self, r, a, dims):
        return super().hparams(r, a, dims) | {
            "rope_layers": tuple((il + 1) % NO_ROPE_STEP != 0 for il in range(dims["n_layers"]))
        }


FAMILY = SmolLM3("smollm3", ("smollm3",))
