"""How the weights are spread over processes and stepped: torch.distributed
(dist), DDP/FSDP2 wrapping (parallel), the update engines (update, zero for
DeepSpeed) and learning-rate schedules (schedules).
"""
