"""``hami simulate``: the scheduler's own decision code run over a workload trace."""
