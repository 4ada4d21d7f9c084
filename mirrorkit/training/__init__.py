"""Training under a strategy: `mk.build` and what acts on the gradient all-reduce.

`building` is `mk.build` (model, optimizer state and metrics under the scope);
`compression` all-reduces gradients in fp16/bf16.
"""
