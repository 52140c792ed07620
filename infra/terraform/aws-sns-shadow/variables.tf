variable "name" {
  description = "Name of the stream: the shadow queue is <name>-shadow; a topic created here is <name>."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,60}$", var.name))
    error_message = "name: 1-60 letters, digits, '-' or '_' (room is left for -shadow and -dlq)."
  }
}

variable "topic_arn" {
  description = "The SNS topic the existing system's messages are published to; null creates one."
  type        = string
  default     = null
}

variable "existing_queue_arn" {
  description = "The existing consumer's queue, subscribed to the topic as well (with existing_queue_url); null leaves it alone."
  type        = string
  default     = null
}

variable "existing_queue_url" {
  description = "URL of existing_queue_arn."
  type        = string
  default     = null
}

variable "visibility_timeout_seconds" {
  description = "Visibility timeout of the shadow queue (the bridge deletes a copy once it is recorded)."
  type        = number
  default     = 60
}

variable "message_retention_seconds" {
  description = "Retention of the shadow queue (60 s to 14 days)."
  type        = number
  default     = 345600
}

variable "max_receive_count" {
  description = "Receives after which a copy moves to the shadow queue's dead-letter queue."
  type        = number
  default     = 10
}

variable "bridge_role_names" {
  description = "IAM role names of the bridge that consumes the shadow queue."
  type        = set(string)
  default     = []
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
