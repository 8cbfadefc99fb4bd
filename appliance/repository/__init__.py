"""What is served: configs read from the repository (or pushed), loading and unloading versions through
the registry, warmup, retuning on traffic, ensembles and the models' own calls to other models (BLS)."""
