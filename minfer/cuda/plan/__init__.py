"""Planning: the GEMM path table and its chooser (paths.py), the user's choice (config.py), each
weight's route (routes.py) and route object (linear.py), layer fusion, the weight memory plan and
upload (weights.py), and the kernels a model needs, built before anything is timed (prepare.py)."""
