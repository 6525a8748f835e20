"""What the runtime shows of itself: the event bus (`events`), figures aggregated from
events (`metrics`) and Chrome traces of runs (`trace`). Nothing here acts on a request."""
