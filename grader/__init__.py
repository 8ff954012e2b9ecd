"""The grader of pybench-eval: RQ jobs that grade finished task sessions."""
