"""Training under a strategy: `mk.build` and what acts on the gradient all-reduce.

`building` is `mk.build` (model, optimizer state and metrics under the scope);
`gradient_hooks` is the one ordered chain of hooks around the optimizer's
gradient all-reduce; `compression` all-reduces gradients in fp16/bf16 through it.
"""
