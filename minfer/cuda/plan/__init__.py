"""Planning, pure (no allocation, no launch): the user's choice (config.py), each weight's path
(routes.py, asking the table of minfer.cuda.paths), layer fusion and epilogues (fusion.py), the
bytes of every part (sizes.py), the memory decision (memory.py), and the one frozen Plan they
make (plan.py), which the backend, its upload and buffers (minfer.cuda.load) and the Forward
read."""
