"""MoE ops of torch_npu: ``npu_moe_gating_top_k`` / ``npu_moe_gating_top_k_softmax`` (router ->
top-k experts), ``npu_moe_init_routing`` / ``npu_moe_compute_expert_tokens`` / ``npu_moe_finalize_routing``
(permute tokens by expert, count them, weighted un-permute) and ``npu_grouped_matmul`` (the
experts' FFN matmuls, one group per expert).

* ``gating_softmax.py``: ``npu_moe_gating_top_k_softmax`` (softmax top-k, ``finished`` rows).
* ``gating.py``, ``routing.py``, ``grouped_matmul.py``: op definitions, references and kernels
  (the routing references are vectorized and serve every device; grouped matmul has a per-group
  ``torch.mm`` loop on CPU and a sync-free masked path elsewhere).

Every output is sized by the input shapes (tokens * top_k rows), never by routing values, so an
MoE layer compiles into one static graph.
"""
