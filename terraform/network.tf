# Security groups: the function reaches AWS APIs over HTTPS and the database on 5432; the database accepts only
# the function.

resource "aws_security_group" "lambda" {
  name        = "${var.name}-lambda"
  description = "Overspill broker function"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_vpc_security_group_egress_rule" "lambda_https" {
  #checkov:skip=CKV_AWS_382:The function calls regional AWS APIs (EC2, Pricing, SQS, Secrets Manager, S3) whose addresses are not fixed; egress is limited to HTTPS and the subnets' routes (NAT or VPC endpoints) decide where it goes.
  security_group_id = aws_security_group.lambda.id
  description       = "HTTPS to AWS APIs"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = "0.0.0.0/0"
}

resource "aws_vpc_security_group_egress_rule" "lambda_database" {
  security_group_id            = aws_security_group.lambda.id
  description                  = "PostgreSQL"
  ip_protocol                  = "tcp"
  from_port                    = aws_rds_cluster.this.port
  to_port                      = aws_rds_cluster.this.port
  referenced_security_group_id = aws_security_group.database.id
}

resource "aws_security_group" "database" {
  name        = "${var.name}-database"
  description = "Overspill database"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "database_from_lambda" {
  security_group_id            = aws_security_group.database.id
  description                  = "PostgreSQL from the broker function"
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
  referenced_security_group_id = aws_security_group.lambda.id
}
