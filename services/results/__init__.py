"""What a run's results say and rest on: PyBench's scores over verdicts (``scores``), the estimators and paired
comparisons (``estimates``, over ``comparison``'s outcomes), the epochs of a run (``epochs``) and the manifest of
what it ran with and how it was graded (``manifest``)."""
