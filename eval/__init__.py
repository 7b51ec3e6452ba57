"""Evaluation: run a method over a dataset (`eval.run`), build the paper's tables and figures
(`eval.report`), and look at trajectories (`eval.viewer`). See docs/architecture.md."""
