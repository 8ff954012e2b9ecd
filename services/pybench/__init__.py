"""PyBench's rules, defined once: its message conventions (``rules``), how a suite is laid out and read
(``suite``), its recorded trajectories (``recordings``), code extraction from a reply (``extraction``) and its
categories (``categories``)."""
