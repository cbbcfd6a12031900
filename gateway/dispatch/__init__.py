"""Where requests go and what they weigh there: dispatch tickets (the one writer of this process's load on a
backend), the prefill order per replica, the prefix index's feedback, other processes' load, the retry budget."""
