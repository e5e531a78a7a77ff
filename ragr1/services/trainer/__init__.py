"""The trainer: format-learning SFT, then PPO on rollouts from the Redis stream.

- ``ppo``: the PPO arithmetic, pure tensor functions (GAE, clipped losses, KL, decoupled IS, GRPO).
- ``data``: QA/parquet readers, SFT trajectories as token ids + loss mask (their text: ``ragr1.protocol``).
- ``model``: causal LM + value head on the same trunk, optional LoRA (reference = adapters off).
- ``ppo_trainer``, ``sft``: one update / the SFT stage; ``ray_train``: the update under Ray Train.
- ``checkpoint``: atomic versioned checkpoints; ``publisher``: ``UpdateWeights`` to policy replicas.
- ``loop``: the queue loop (admission control, staleness, de-duplication, resume);
  ``servicer``/``server``/``client``/``metrics``/``cli``: ``ragr1 train sft|ppo`` and ``Trainer.Status``.
"""
