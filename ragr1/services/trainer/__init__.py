"""The trainer: format-learning SFT, then PPO on rollouts from the Redis stream.

- ``ppo_math``: the PPO arithmetic, pure tensor functions (GAE, clipped losses, KL, decoupled IS, GRPO,
  the weight-sync log-prob gap).
- ``data``: QA/parquet readers, SFT trajectories as token ids + loss mask (their text: ``ragr1.protocol``).
- ``model``: causal LM + value head on the same trunk, optional LoRA (reference = adapters off).
- ``updater`` (``PPOUpdater``), ``sft``: one PPO update / the SFT stage; ``ray_train``: the update under Ray
  Train.
- ``checkpoint``: atomic versioned checkpoints; ``publisher``: each version announced in Redis for the policy
  replicas to load, and the fleet they report watched.
- ``loop``: the PPO loop around the queue, in parts: ``admission`` (the staleness window's Redis counters),
  ``groups`` (whole groups, dynamic sampling), ``record`` (each update's record), ``gauges`` (its metrics and
  alarms), ``ppo_loop`` (resume, collect, update, checkpoint, announce);
  ``servicer``/``server``/``client``/``metrics``/``cli``: ``ragr1 train sft|ppo`` and ``Trainer.Status``.
"""
