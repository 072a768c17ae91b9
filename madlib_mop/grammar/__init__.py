"""MADlib's parameter grammar (compile and fit params, optimizers, grids), parsed and checked
against whitelists, never run: plain Python that imports no TensorFlow, so the client and
the calling session read stored configurations without it."""
