"""Built-in plugin: the tools every runtime has (``task_complete``, ``ask_user``, ``todowrite``)."""
