"""`ray` devices: a device that is one Ray actor (`device`), the actor itself (`actor`,
importing only what an actor process needs) and the cluster they share (`cluster`).
Nothing outside this room imports ray."""
