"""Planning: the user's choice (config.py), each weight's path (routes.py, asking the table of
minfer.cuda.paths), layer fusion, the weight memory plan and upload (weights.py), and the
kernels a model needs, built before anything is timed (prepare.py)."""
