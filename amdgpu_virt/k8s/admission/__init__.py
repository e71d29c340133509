"""The mutating admission webhook for pods that request AMD GPUs.

Face: :mod:`.webhook` (the review and its server). Inside: :mod:`.rules`
(the admission rules, pure), :mod:`.intent` and :mod:`.stated` (a pod's
stated needs judged by the policy engine) and :mod:`.webhookapi` (GPU
shapes the cluster registers, Events). Imported by the command only.
"""

__all__ = ['webhook']
