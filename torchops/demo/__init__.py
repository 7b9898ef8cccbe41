"""`python -m torchops.demo`: the end-to-end main job. Trains a conv net + recurrent head on
scikit-learn's bundled digits with K synchronous replicas (torchops.optim.SyncReplicasOptimizer),
exports it with TorchScript, reloads it in a fresh process, and serves it through torchops.nn.Batched
to 16 client threads. Modules: data, model, train, serve, report; entry point in __main__."""
