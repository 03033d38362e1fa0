"""Quick slicer: keep the first N layers of a GGUF (for the device's 64 MiB transfer limit).

python3 scripts/slice_gguf_quick.py IN.gguf OUT.gguf N    (scripts/slice_model.py, engineer
"synth", is the full tool; this is the backend tests' stop-gap.)
"""

import re
import sys

import gguf

from minfer.gguf_write import metadata_from_reader, write_gguf
from minfer.loader import load_model

src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
m = load_model(src)
arch = m.config.arch
md = metadata_from_reader(m)
md[f"{arch}.block_count"] = gguf.GGUFValue(n, gguf.GGUFValueType.UINT32)
keep = [t for name, t in m.tensors.items()
        if not (re.match(r"blk\.(\d+)\.", name) and int(name.split(".")[1]) >= n)]
write_gguf(dst, arch, md, [(t.name, t.qtype, t.shape, t.data) for t in keep], progress=False)
print(f"{dst}: {n} of {m.config.n_layers} layers, {len(keep)} tensors")
