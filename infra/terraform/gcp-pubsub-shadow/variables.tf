variable "project_id" {
  description = "The project of the topic and the shadow subscription."
  type        = string
}

variable "name" {
  description = "Name of the stream: the subscription is <name>-shadow-fencebridge."
  type        = string
}

variable "topic_id" {
  description = "The existing topic (projects/<project>/topics/<name>) the existing system's subscription reads."
  type        = string
}

variable "message_retention_duration" {
  description = "How long the shadow subscription keeps unacknowledged messages."
  type        = string
  default     = "604800s"
}

variable "service_account_id" {
  description = "Account id of the bridge's service account (default: derived from name)."
  type        = string
  default     = null
}

variable "kubernetes_service_account" {
  description = "namespace/name of the Kubernetes service account bound by Workload Identity, if any."
  type        = string
  default     = null
}

variable "labels" {
  description = "Labels for every resource."
  type        = map(string)
  default     = {}
}
