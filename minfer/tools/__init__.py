"""What the commands build on beyond the forward: the benchmark and its output, perplexity and KL divergence, synthetic models, the default-model fetch, the identity gates."""
