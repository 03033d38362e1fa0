"""`minfer perplexity`'s tool (the command keeps the flags and their checks): windows.py, the
windows, the math and minfer's logits file; llamacpp.py, llama.cpp's log-prob file (read and
written as llama-perplexity does); report.py, what is printed; run.py, one run."""
