"""The block-scaled int8 path as one package (docs/blk.md): the path record and its route
(path.py), its launchers (launch.py, the stream-K scheduler stream_k.py), its numpy twin
(twin.py). Nothing outside minfer/cuda/paths/blk/ needs to know how blk works: it asks BLK."""

from minfer.cuda.paths.blk.path import BLK, BLK_OPERAND, BLK_TOKEN_OPERAND, BlkPath, BlkRoute

__all__ = ["BLK", "BLK_OPERAND", "BLK_TOKEN_OPERAND", "BlkPath", "BlkRoute"]
