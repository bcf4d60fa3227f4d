"""Where the policy trainer and the rollout engines run: in this process, or as Ray actors."""
