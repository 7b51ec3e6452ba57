"""InfoMem, the answer-conditioned reward several methods train with: the gain and its scorer
(`gain`) and its group step inside verl's replay buffer (`group`). docs/info_gain.md."""
