"""End-to-end speculative decoding with real models: the experiment behind ``portable-verify e2e``.

``config`` (what a run measures), ``runtimes`` (target and draft in torch or OpenVINO),
``openvino_model`` (conversion once, compiled stateful models), ``ngram`` (prompt lookup),
``dense_verifier`` (the textbook verifier in the loop), ``runner`` (interleaved runs -> data).
The CLI module only parses arguments and renders what ``runner.run_e2e`` returns.
"""
