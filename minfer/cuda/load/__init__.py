"""Loading a planned model onto the GPU: the kernels built before anything is timed
(prepare.py), the weight upload (weights.py) and the buffers (buffers.py)."""
