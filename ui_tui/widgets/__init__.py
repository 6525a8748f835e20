"""Dashboard and stepper widgets; each draws one part of a LiveView or a Stepper."""
