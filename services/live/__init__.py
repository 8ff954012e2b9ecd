"""Live state in Redis beside the task states (``services.state``): the admission window (``admission``), the
service's API keys (``apikeys``) and the sealing of model keys (``secretbox``), what workers run with
(``components``) and that they are alive (``liveness``), an evaluation's reply cache (``replies``) and spend
(``spend``), and storage quotas (``retention``)."""
