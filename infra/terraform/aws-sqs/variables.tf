variable "name" {
  description = "Queue name. For a FIFO queue, without the .fifo suffix (it is added)."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,70}$", var.name))
    error_message = "name: 1-70 letters, digits, '-' or '_' (room is left for -dlq and .fifo)."
  }
}

variable "fifo" {
  description = "A FIFO queue (ordered per message group; the bridge claims one row per group at a time)."
  type        = bool
  default     = false
}

variable "visibility_timeout_seconds" {
  description = <<-EOT
    How long a received message stays invisible. In the default after_inbox ack mode the bridge
    deletes a message as soon as its work row has committed, so this only has to cover one
    receive-and-insert; in after_outcome mode the bridge extends it while the work progresses.
  EOT
  type        = number
  default     = 60

  validation {
    condition     = var.visibility_timeout_seconds >= 0 && var.visibility_timeout_seconds <= 43200
    error_message = "visibility_timeout_seconds must be within 0-43200 (12 hours)."
  }
}

variable "message_retention_seconds" {
  description = "How long an undelivered message is kept (60 s to 14 days). Default: 4 days."
  type        = number
  default     = 345600

  validation {
    condition     = var.message_retention_seconds >= 60 && var.message_retention_seconds <= 1209600
    error_message = "message_retention_seconds must be within 60-1209600 (14 days)."
  }
}

variable "dlq_message_retention_seconds" {
  description = <<-EOT
    Retention in the dead-letter queue. A standard queue keeps a message's original enqueue time
    when it moves to the DLQ, so this must exceed the source retention or moved messages expire
    early. Default: the maximum, 14 days.
  EOT
  type        = number
  default     = 1209600

  validation {
    condition     = var.dlq_message_retention_seconds >= 60 && var.dlq_message_retention_seconds <= 1209600
    error_message = "dlq_message_retention_seconds must be within 60-1209600 (14 days)."
  }
}

variable "max_receive_count" {
  description = <<-EOT
    Receives after which SQS moves a message to the dead-letter queue. A message the bridge cannot
    even record (the database is down, the message keeps failing before its commit) ends there
    instead of cycling forever. Undecodable input is not one of those: the bridge records it as
    quarantined and deletes it.
  EOT
  type        = number
  default     = 10

  validation {
    condition     = var.max_receive_count >= 1 && var.max_receive_count <= 1000
    error_message = "max_receive_count must be within 1-1000."
  }
}

variable "receive_wait_time_seconds" {
  description = "Long-poll wait for ReceiveMessage (0-20 s)."
  type        = number
  default     = 20

  validation {
    condition     = var.receive_wait_time_seconds >= 0 && var.receive_wait_time_seconds <= 20
    error_message = "receive_wait_time_seconds must be within 0-20."
  }
}

variable "kms_key_arn" {
  description = <<-EOT
    A customer-managed KMS key for server-side encryption. Null (the default) uses SQS-managed
    encryption (SSE-SQS). With a key, the bridge's policy also gets kms:Decrypt on it.
  EOT
  type        = string
  default     = null
}

variable "bridge_role_names" {
  description = "IAM roles (for example the bridge's IRSA or ECS task role) to attach the bridge policy to."
  type        = set(string)
  default     = []
}

variable "dlq_alarm_actions" {
  description = "SNS topic ARNs notified when the dead-letter queue holds messages. Empty: no alarm."
  type        = list(string)
  default     = []
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
