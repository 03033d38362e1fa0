"""A model on a backend, driven: the Python API (`api.Engine`, `minfer.Engine`), the one place a
backend is built (`backends.make_backend`), prompt files over Ray actors (`ray/`). The driving
itself (the packed layout, the schedule, the runner of one prompt and of many, the continuous
scheduler) is minfer.batch, below the backends: it knows them only by their protocol."""
