"""Bring-your-own envs: gymnasium vector envs and MuJoCo Playground MJX envs behind `VecEnv`."""
